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
# # 6. A small online RL run per engine profile
#
# The earlier chapters measure the mismatch on one batch. A run is many batches: the rollout
# engine samples, the trainer steps, the new weights go back into the running engine, and the
# mismatch shows up on the run's dashboard as curves. PipelineRL's V0 -> V1 move is the classic
# case: with V1's defaults the run's `kl_new_old` and `clamp_log_ratio_new_old_indicator` sat
# far from the V0 reference from the first step on, and they came back once the fixes went in
# (processed logprobs, no prefix caching, no async scheduling, an fp32 LM head).
#
# This chapter runs that loop for real on the built-in model's arithmetic task (a checkable
# reward), once per engine profile, from the same initial weights and with the same prompts and
# seeds at every step:
#
# * `pipelinerl-parity`: the fixed setup;
# * `vllm-v1-defaults`: vLLM V1 with nothing set (raw logprobs, prefix caching and async
#   scheduling on);
# * `parity-bf16-head`: the parity setup with the rollout LM head in bf16.
#
# Each profile gets one real `AsyncLLM` (`rlparity.capture.AsyncEngine`). Every step: sample
# `n_prompts` x `n_samples`; the trainer (transformers, fp32 head, AdamW whose state persists)
# rescores every token with the weights that sampled it (pi_old) and takes one optimizer step
# with the objective layer's code (`rlparity.train.train_step`, GSPO by default); the new weights
# are saved as safetensors and pushed into the running engine with the inflight path (pause with
# `keep`, load through the worker extension, reset the prefix cache, resume). The body runs in
# float32 on both sides, so the profiles differ in what they name and nothing else.

# %% tags=["parameters"]
ci = False                 # small sizes for CI
model = None               # a local checkpoint (the initial weights); None builds the tiny built-in model
size = "tiny"              # built-in model size when model is None
device = "cpu"             # trainer device ("cuda" on a GPU host); vLLM picks its own platform
steps = None               # optimizer steps per profile (None: rlparity.config.defaults().rl.steps)
n_prompts = None           # prompts per step (None: the defaults')
n_samples = None           # samples per prompt: the group of the group-normalised advantage
max_tokens = None          # response tokens per sample
lr = None                  # AdamW learning rate
loss = "gspo"              # gspo (PipelineRL's clamp indicator is then GSPO's sequence clip), ppo or grpo
old_policy = "trainer"     # the loss's ratio denominator: pi_old recomputed ("trainer") or mu ("rollout")
async_rollouts = False     # generate step k+1 while step k trains (one step of lag)
seed = 0
gpu_memory_utilization = None
engine_log_level = "ERROR"  # vLLM's log level in this notebook
max_parity_ratio_dev = 0.01   # |mean pi_old/mu - 1| the parity run must stay under on every step
min_defaults_ratio_dev = 0.03  # ... the vllm-v1-defaults run must exceed from step 0
min_clip_multiple = 3.0       # its clamp indicator over the parity run's (the parity run's floored at 1e-3)
out_dir = "artifacts/06_rl_run"

# %%
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", engine_log_level)  # before vLLM is imported

import rlparity
from rlparity.config import defaults
from rlparity.config.provenance import write_json
from rlparity.diagnose import diagnose
from rlparity.experiments import rl as ex
from rlparity.metrics import rl as mrl
from rlparity.models import make_model
from rlparity.plot import init_notebook
from rlparity.plot.rl import plot_rl_curves

init_notebook()
d = defaults().rl
if ci:
    steps, n_prompts, n_samples, max_tokens = steps or 5, n_prompts or 16, n_samples or 8, max_tokens or 24
steps, n_prompts, n_samples = steps or d.steps, n_prompts or d.n_prompts, n_samples or d.n_samples
max_tokens, lr = max_tokens or d.max_tokens, lr or d.lr
model = model or str(make_model(size, progress=False))
out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
engine = {"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}
profiles = list(d.profiles)
print(f"model {model}; profiles {profiles}; {steps} steps of {n_prompts} prompts x {n_samples} samples x "
      f"{max_tokens} tokens; {loss}, lr {lr}, ratio denominator {old_policy}, async rollouts {async_rollouts}")

# %% [markdown]
# ## The run
# `rl_run` starts one engine per profile (closed before the next starts) and returns every step's
# trace, named `<profile>@step_NNN`. It computes no curve: it only records what it did and how
# long each part took (`attrs["rl"]`). With `async_rollouts=True` the rollouts of step k+1 are
# submitted with `capture_async` before step k trains, so they are sampled by version k while the
# trainer computes version k+1 (PipelineRL's one step of lag); the trainer keeps its previous
# weights for one step to score those tokens at their own version.

# %%
t0 = time.perf_counter()
arms = ex.rl_run(model, profiles, steps, loss=loss, old_policy=old_policy, n_prompts=n_prompts, n_samples=n_samples,
                 max_tokens=max_tokens, lr=lr, async_rollouts=async_rollouts, device=device, seed=seed,
                 engine=engine, log=lambda line: None)
elapsed = time.perf_counter() - t0
engine_starts = {p: arms[mrl.step_arm(p, 0)].attrs["rl"]["engine_startup_s"] for p in profiles}
print(f"{len(arms)} steps in {elapsed:.0f} s; engine starts (s): {engine_starts}")

# %% [markdown]
# ## The curves
# `rlparity.metrics.rl.rl_curves` turns the kept traces into one Dataset with dims
# `(profile, step)`. PipelineRL's names are computed with PipelineRL's formulas
# (`rlparity.metrics.dashboard.pipelinerl_metrics`) on the **backend pair** (pi_old, mu), pi_old
# read at each token's own version: `kl_new_old`, `clamp_log_ratio_new_old_indicator` (GSPO's
# sequence clip for a GSPO run), `ratio_new_old`, `ess`. Beside them: the reward, the trainer's
# entropy, the mean ratio pi_old/mu, the lag, the share of tokens a token band would mask and
# the wall time of each step.

# %%
curves = mrl.rl_curves(arms)
curves.to_dataframe().round(4).T

# %%
plot_rl_curves(curves)

# %% [markdown]
# ## Each profile against the parity run
# From step 0 the `vllm-v1-defaults` run's ratio pi_old/mu is off 1 by several percent: vLLM
# reports the raw logprob (temperature 1, full vocabulary) of a token it sampled from the
# temperature-scaled top-k distribution, so every GSPO sequence ratio leaves GSPO's clip range
# [1 - 3e-4, 1 + 4e-4]. The bf16 head keeps the mean ratio centred (its rounding is symmetric) but
# its per-token noise, averaged over a sequence, is still larger than GSPO's clip range, so the
# clamp indicator catches it. The parity run clips nothing.

# %%
contrast = mrl.profile_contrast(curves, "pipelinerl-parity")
import pandas as pd

pd.DataFrame(contrast).T.round(4)

# %% [markdown]
# ## What the reward does
# With `old_policy="trainer"` (the default, as verl computes it) the trainer recomputes pi_old, so
# the update never sees mu: a backend mismatch changes what the dashboard says and which samples
# the engine draws, not the gradient. The reward curves then differ only by sampling noise. With
# `old_policy="rollout"` (PipelineRL: the engine's logprobs are the ratio's denominator) the
# mismatch enters the clip and the runs can drift apart; see the write-up of this chapter in the
# issue's closing note for what a longer run on each setting showed.

# %%
reward = curves["reward"].to_pandas().T
reward.round(3)

# %% [markdown]
# ## Any step can be diagnosed later
# Every step's trace is in the store; `diagnose` reads it like any other capture. Here, step 0 of
# every profile.

# %%
first = {a: ds for a, ds in arms.items() if mrl.parse_step_arm(a)[1] == 0}
report = diagnose(first, title="RL run: step 0 of every profile")
report

# %% [markdown]
# ## What this notebook asserts

# %%
par, v1 = curves.sel(profile="pipelinerl-parity"), curves.sel(profile="vllm-v1-defaults")
par_clip = max(float(par["clamp_log_ratio_new_old_indicator"].mean()), 1e-3)
assert float(abs(par["mean_ratio"] - 1).max()) < max_parity_ratio_dev, par["mean_ratio"].values
assert abs(float(v1["mean_ratio"].isel(step=0)) - 1) > min_defaults_ratio_dev, v1["mean_ratio"].values
assert float(abs(v1["mean_ratio"] - 1).min()) > min_defaults_ratio_dev, v1["mean_ratio"].values
assert float(v1["clamp_log_ratio_new_old_indicator"].isel(step=0)) > min_clip_multiple * par_clip
assert float(v1["clamp_log_ratio_new_old_indicator"].mean()) > min_clip_multiple * par_clip
updates = [a for a, ds in arms.items() if ds.attrs["rl"]["update"]["version"] == mrl.parse_step_arm(a)[1] + 1]
assert len(updates) == len(arms) == len(profiles) * steps  # every step pushed its weights into the engine
assert float(curves["kl_update"].min()) > 0  # every step moved the policy
if async_rollouts:
    assert float(curves["lag"].isel(step=slice(1, None)).min()) > 0
else:
    assert float(curves["lag"].max()) == 0
assert any(f.name == "raw_logprobs_used_as_processed" and f.arm == "vllm-v1-defaults@step_000" for f in report)
print(f"parity: max |mean ratio - 1| {float(abs(par['mean_ratio'] - 1).max()):.2e}; vllm-v1-defaults: mean ratio "
      f"{float(v1['mean_ratio'].isel(step=0)):.4f} at step 0, clamp indicator "
      f"{float(v1['clamp_log_ratio_new_old_indicator'].mean()):.3f} vs {float(par['clamp_log_ratio_new_old_indicator'].mean()):.3f}")

# %%
store = rlparity.trace.save(arms, out / "rl.zarr")
write_json(out / "results.json", {
    "curves": mrl.curves_records(curves), "contrast": contrast, "findings": report.to_dict()["findings"],
    "steps_run": steps, "updates_pushed": len(updates), "engine_startup_s": engine_starts,
    "elapsed_s": round(elapsed, 1), "store": str(store),
    "sizes": {"steps": steps, "n_prompts": n_prompts, "n_samples": n_samples, "max_tokens": max_tokens, "lr": lr,
              "loss": loss, "old_policy": old_policy, "async_rollouts": async_rollouts},
    "thresholds": {"max_parity_ratio_dev": max_parity_ratio_dev, "min_defaults_ratio_dev": min_defaults_ratio_dev,
                   "min_clip_multiple": min_clip_multiple}})
print(f"wrote {store} and {out / 'results.json'}")
