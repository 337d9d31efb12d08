"""Traces larger than memory: a lazy trace (``open_arms(store, chunks=N)``, dask over the zarr
chunks) is summarised block by block, equal to a float64 numpy reference over the whole trace held
in memory; its blocks are validated and checked against the store's CRC-32 record as they are read."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from rlparity import trace as rt
from rlparity.metrics import summary
from rlparity.metrics.stream import SummaryAccumulator
from rlparity.testing import synthetic_trace
from rlparity.trace import StoreDamagedError

pytest.importorskip("dask")


def _reference(ds, eps=0.2):
    """The summary statistics by their textbook formulas in float64 over every real token."""
    m = ds["response_mask"].values.astype(bool)
    lp = ds["trainer_processed_logprob"].values.astype(np.float64)[m]
    lm = ds["rollout_logprob"].values.astype(np.float64)[m]
    d = lp - lm
    x = d[np.isfinite(d)]
    r = np.exp(x)
    pi, mu = np.exp(lp), np.exp(lm)
    return {"n_tokens": m.sum(), "n_used": x.size, "n_zero_prob": np.isneginf(lp).sum(),
            "log_ratio_mean": x.mean(), "abs_log_ratio_mean": np.abs(x).mean(),
            "abs_log_ratio_rms": np.sqrt((x ** 2).mean()), "abs_log_ratio_max": np.abs(x).max(),
            "log_ratio_q50": np.median(x), "log_ratio_q99": np.quantile(x, 0.99),
            "kl_k1": -x.mean(), "kl_k2": (x ** 2 / 2).mean(), "kl_k3": (r - 1 - x).mean(),
            "mean_ratio": r.mean(), "clip_fraction": ((r < 1 - eps) | (r > 1 + eps)).mean(),
            "ess_token": r.sum() ** 2 / (r.size * (r ** 2).sum()),
            "prob_diff_mean": np.abs(pi - mu).mean(), "prob_diff_max": np.abs(pi - mu).max(),
            "prob_diff_std": np.abs(pi - mu).std(), "prob_pearson": np.corrcoef(pi, mu)[0, 1]}


@pytest.fixture()
def store(tmp_path):
    ds = synthetic_trace(n_sequences=37, max_len=30, noise=0.05, seed=3, arm="big")
    lp = ds["trainer_processed_logprob"].values.copy()
    lp[2, 0] = -np.inf  # a token the trainer gives probability 0: counted, not averaged
    ds["trainer_processed_logprob"].values[:] = lp
    path = tmp_path / "t.zarr"
    rt.save(ds, path)
    return path, ds


@pytest.mark.parametrize("chunks", [1, 5, 37, 100])
def test_lazy_summary_equals_a_float64_reference(store, chunks):
    path, ds = store
    lazy = rt.open_arms(path, chunks=chunks)["big"]
    assert rt.is_lazy(lazy) and not rt.is_lazy(rt.open_arms(path)["big"])
    got = summary(lazy, trainer="processed", eps=0.2)
    ref = _reference(ds)
    assert ref["n_zero_prob"] == 1
    for k, v in ref.items():
        assert float(got[k]) == pytest.approx(float(v), rel=1e-9, abs=1e-12), k
    assert got.attrs["arm"] == "big" and got["abs_log_ratio_mean"].attrs["units"] == "nats"


def test_quantiles_beyond_memory_come_from_the_histogram_within_a_bin():
    rng = np.random.default_rng(0)
    d = np.concatenate([rng.normal(0, 0.01, 40_000), rng.standard_cauchy(2_000) * 1e-3])
    lm = np.log(rng.uniform(0.05, 1.0, d.size))
    acc = SummaryAccumulator(0.2, exact_quantiles_below=0)  # the histogram from the first block on
    for part in np.array_split(np.arange(d.size), 7):
        acc.add(lm[part] + d[part], lm[part])
    assert acc.values is None
    x = np.sort(d)
    for q, got in zip((0.01, 0.05, 0.5, 0.95, 0.99), acc.quantiles()):
        t = q * (x.size - 1)  # np.quantile's rank: between the order statistics lo and hi
        lo, hi = x[int(np.floor(t))], x[int(np.ceil(t))]
        assert lo - 0.037 * abs(lo) - 1e-9 <= got <= hi + 0.037 * abs(hi) + 1e-9, (q, got, lo, hi)
        assert abs(got - np.quantile(d, q)) < 5e-3 * np.std(d)


def test_a_changed_value_is_found_when_the_lazy_trace_is_read(store):
    path, _ = store
    arr = zarr.open_array(str(path / "big" / "rollout_logprob"), mode="r+")
    arr[30, 1] = arr[30, 1] - 0.5  # a valid chunk with another value: only the CRC record can tell
    lazy = rt.open_arms(path, chunks=8)["big"]  # opening reads no values
    with pytest.raises(StoreDamagedError, match="rollout_logprob"):
        summary(lazy)
    with pytest.raises(StoreDamagedError):
        rt.open_arms(path)  # the eager path agrees


def test_lazy_traces_refuse_what_they_cannot_stream(store):
    path, _ = store
    lazy = rt.open_arms(path, chunks=8)["big"]
    with pytest.raises(ValueError, match="dim=None"):
        summary(lazy, dim="sequence")
    with pytest.raises(ValueError, match="at least 1"):
        rt.open_arms(path, chunks=0)
    with pytest.raises(TypeError, match="sequences per block"):
        rt.open_arms(path, chunks="big")


def test_cli_summary_reads_in_blocks_the_same_numbers(store, cli):
    import json

    path, _ = store
    whole = cli("summary", str(path), "--json")
    lazy = cli("summary", str(path), "--json", "--chunks", "4")
    assert whole.exit_code == 0 and lazy.exit_code == 0, lazy.stderr
    a, b = json.loads(whole.stdout)["big"], json.loads(lazy.stdout)["big"]
    assert set(b) <= set(a) and b["n_tokens"] == a["n_tokens"] > 500
    for k, v in b.items():
        if isinstance(v, float) and v == v:
            assert v == pytest.approx(a[k], rel=1e-9, abs=1e-12), k
    whole = cli("summary", str(path), "--json", "--names", "verl")
    lazy = cli("summary", str(path), "--json", "--chunks", "4", "--names", "verl")
    assert whole.exit_code == 0 and lazy.exit_code == 0, lazy.stderr
    a, b = json.loads(whole.stdout)["big"], json.loads(lazy.stdout)["big"]
    assert b["n_tokens"] == a["n_tokens"] > 500 and len(b["metrics"]) == len(a["metrics"]) > 40
    for k, v in a["metrics"].items():
        assert b["metrics"][k] == pytest.approx(v, rel=1e-9, abs=1e-12, nan_ok=True), k


def test_a_lazy_trace_whose_trainer_scored_other_tokens_is_refused(tmp_path):
    ds = synthetic_trace(n_sequences=9, max_len=12, seed=1, arm="x")
    ds.attrs["scored_token_checksum"] = "0123456789abcdef"  # not these tokens' checksum
    path = tmp_path / "x.zarr"
    ds.to_zarr(path, group="x", mode="w", consolidated=True, zarr_format=2)  # written by hand: no CRC record
    with pytest.raises(rt.TraceValidationError, match="checksum mismatch"):
        summary(rt.open_arms(path, chunks=4)["x"])


def _verl_reference(ds, cap):
    """A few of verl's dashboard numbers by their textbook formulas in float64, per sequence in a
    Python loop over the real tokens (independent of the vectorised formulas)."""
    m = ds["response_mask"].values.astype(bool)
    lp = ds["trainer_processed_logprob"].values.astype(np.float64)
    lm = ds["rollout_logprob"].values.astype(np.float64)
    d = np.concatenate([lp[i][m[i]] - lm[i][m[i]] for i in range(len(m))])
    seq_lpd = np.array([lm[i][m[i]].mean() - lp[i][m[i]].mean() for i in range(len(m)) if m[i].any()])
    w = np.minimum(np.exp(np.clip(d, -20, 20)), cap)
    p, q = np.exp(lp[m]), np.exp(lm[m])
    return {"rollout_corr/kl": -d.mean(), "rollout_corr/k3_kl": (np.exp(d) - d - 1).mean(),
            "rollout_corr/log_ppl_diff": seq_lpd.mean(), "rollout_corr/log_ppl_diff_max": seq_lpd.max(),
            "rollout_corr/rollout_is_mean": w.mean(), "rollout_corr/rollout_is_max": w.max(),
            "training/rollout_probs_diff_std": np.abs(p - q).std(ddof=1),
            "training/rollout_actor_probs_pearson_corr": np.corrcoef(p, q)[0, 1]}


@pytest.mark.parametrize("chunks", [1, 6, 100])
def test_lazy_dashboards_equal_the_eager_ones_and_a_float64_reference(store, chunks):
    """Every peer's dashboard streamed over a lazy trace's chunks (dask) gives the numbers of the
    same trace in memory; verl's also match a per-sequence float64 loop."""
    from rlparity.metrics import as_dashboard
    from rlparity.metrics.dashboard import DASHBOARDS
    from rlparity.metrics.objective import OBJECTIVE_DEFAULTS

    path, ds = store
    lazy, eager = rt.open_arms(path, chunks=chunks)["big"], rt.open_arms(path)["big"]
    for name in DASHBOARDS:
        got, want = as_dashboard(lazy, name, trainer="processed"), as_dashboard(eager, name, trainer="processed")
        assert rt.is_lazy(lazy) and set(got) == set(want) and len(want) >= 1
        assert (got.n_tokens, got.n_excluded) == (want.n_tokens, want.n_excluded) == (int(ds.response_mask.sum()) - 1, 1)
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-10, abs=1e-13, nan_ok=True), f"{name} {k}"
    ref = _verl_reference(ds.where(np.isfinite(ds["trainer_processed_logprob"]) | ~ds["response_mask"].astype(bool))
                          .assign(response_mask=ds["response_mask"] & np.isfinite(ds["trainer_processed_logprob"])),
                          OBJECTIVE_DEFAULTS.is_cap)
    got = as_dashboard(lazy, "verl", trainer="processed")
    for k, v in ref.items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k


def test_lazy_dashboards_stream_in_one_dask_pass(store):
    """The dashboard of a lazy trace reads each chunk of its variables once, in one computation
    (a dask callback counts the computations)."""
    from dask.callbacks import Callback

    from rlparity.metrics import as_dashboard

    path, _ = store
    lazy = rt.open_arms(path, chunks=6)["big"]
    computes = []
    with Callback(start=lambda dsk: computes.append(len(dsk))):
        as_dashboard(lazy, "verl", trainer="processed")
    assert len(computes) == 1, computes  # one dask.compute for every metric of the dashboard


def _verdicts(report):
    """What a diagnosis concluded, as comparable data (every finding, the attribution, headlines)."""
    import json

    d = report.to_dict()
    d.pop("context", None)
    return json.loads(json.dumps(d, sort_keys=True, default=str))


@pytest.mark.parametrize("name", ["cpu-boundary", "cpu-head", "cpu-semantic", "h200-inflight"])
def test_diagnose_of_a_shipped_example_opened_lazily_equals_the_eager_one(name):
    from rlparity.datasets import example_path
    from rlparity.diagnose import diagnose

    path = example_path(name)
    eager = diagnose(path)
    lazy_arms = rt.open_arms(path, chunks=16)
    assert all(rt.is_lazy(ds) for ds in lazy_arms.values())
    lazy = diagnose(lazy_arms)
    assert len(eager) > 0 and _verdicts(lazy) == _verdicts(eager)
    assert "lazy_sample" not in lazy.context  # small enough to be judged whole


def test_diagnose_of_a_large_lazy_trace_judges_a_recorded_sample(store, cli):
    """Above the token budget a lazy arm is judged on every k-th sequence, said in the report;
    the sample is exactly those sequences of the eager trace."""
    from rlparity.diagnose import diagnose

    path, ds = store
    lazy = rt.open_arms(path, chunks=5)
    tokens = int(ds["response_mask"].sum())
    report = diagnose(lazy, lazy_tokens=-(-tokens // 4))
    assert "one sequence in 4: 10 of 37 sequences" in report.context["lazy_sample"]["big"]
    sample = rt.load_sample(lazy["big"], every=4)
    want = ds.isel(sequence=slice(0, None, 4))
    for var in ("token_id", "response_mask", "rollout_logprob", "trainer_processed_logprob"):
        np.testing.assert_array_equal(sample[var].values, want[var].values)
    want.attrs = {k: v for k, v in want.attrs.items() if k != "scored_token_checksum"}  # the whole trace's
    assert _verdicts(report) == _verdicts(diagnose(want))
    whole = cli("diagnose", str(path), "--json")
    streamed = cli("diagnose", str(path), "--json", "--chunks", "6")
    assert whole.exit_code == streamed.exit_code and whole.exit_code in (0, 1), streamed.stderr
    import json

    a, b = json.loads(whole.stdout), json.loads(streamed.stdout)
    a.pop("context"), b.pop("context")
    assert a == b and len(a["findings"]) > 0
