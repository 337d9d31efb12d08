"""``dim=`` on the tables (issue 27): a table that reduces tokens takes ``dim=`` (default every
token, unchanged), checked against a float64 numpy reduction over the same axis; a table of whole
arms has no ``dim=``."""

from __future__ import annotations

import numpy as np
import pytest

from rlparity.datasets import example_path
from rlparity.metrics import as_dashboard
from rlparity.metrics.ablation import ablation_table, batch_summary, batch_table
from rlparity.metrics.floors import floor_table
from rlparity.metrics.head_precision import head_table
from rlparity.metrics.inflight import inflight_table
from rlparity.metrics.rl import step_metrics
from rlparity.testing import synthetic_trace
from rlparity.trace import open_arms, with_trainer


def _d(ds):
    """d as the trace defines it (the difference taken in the stored dtype: float32 in the shipped
    examples), then float64 for every reduction."""
    m = ds["response_mask"].values.astype(bool)
    d = (ds["trainer_processed_logprob"].values - ds["rollout_logprob"].values).astype(np.float64)
    return np.where(m & np.isfinite(d), d, np.nan)


@pytest.mark.parametrize("dim, axis", [("position", 1), ("sequence", 0)])
def test_head_table_reduces_over_dim_like_numpy(dim, axis):
    path = example_path("cpu-head")
    arms = open_arms(path)
    whole = head_table(path)
    table = head_table(path, dim=dim, trainer="processed")
    for r in table["rollout_head"].values:
        for t in table["trainer_head"].values:
            name = str(whole["arm"].sel(rollout_head=r, trainer_head=t).item())
            d = _d(arms[name])
            with np.errstate(invalid="ignore"):
                rms = np.sqrt(np.nanmean(d ** 2, axis=axis))
                mx = np.nanmax(np.abs(d), axis=axis)
            got = table.sel(rollout_head=r, trainer_head=t)
            keep = "sequence" if dim == "position" else "position"
            assert got["abs_log_ratio_rms"].dims == (keep,)
            n = np.isfinite(d).sum(axis=axis)
            np.testing.assert_allclose(got["n_tokens"].values[: n.size][n > 0], n[n > 0])
            # the shipped examples are float32 and summary accumulates a float32 trace in float32
            # (as before issue 23): agreement with the float64 reference to float32 rounding
            np.testing.assert_allclose(got["abs_log_ratio_rms"].values[: n.size][n > 0], rms[n > 0], rtol=2e-6)
            np.testing.assert_allclose(got["abs_log_ratio_max"].values[: n.size][n > 0], mx[n > 0], rtol=1e-12)
    # the default is every token, one number per cell, as before
    assert whole["abs_log_ratio_rms"].dims == ("rollout_head", "trainer_head")


def _two_shapes():
    a = synthetic_trace(n_sequences=9, max_len=14, noise=0.03, seed=2)
    rng = np.random.default_rng(0)
    x = a["trainer_processed_logprob"].values
    b = with_trainer(a, {"trainer_processed_logprob": np.minimum(x + rng.normal(0, 1e-3, x.shape), 0)})
    a.attrs["trainer"] = {"score_s": 2.0, "shape": "batch1"}
    b.attrs["trainer"] = {"score_s": 1.0, "shape": "left16"}
    return a, b


@pytest.mark.parametrize("dim, axis", [(None, None), ("position", 1), ("sequence", 0)])
def test_floor_table_reduces_over_dim_like_numpy(dim, axis):
    a, b = _two_shapes()
    table = floor_table({"batch1": a, "left16": b}, "batch1", dim=dim)
    m = a["response_mask"].values.astype(bool)
    delta = b["trainer_processed_logprob"].values.astype(np.float64) - a["trainer_processed_logprob"].values
    delta = np.where(m, delta, np.nan)
    gap = np.nanmean(np.abs(_d(a)), axis=axis)
    floor = np.nanmean(np.abs(delta), axis=axis)
    got = table.sel(shape="left16")
    np.testing.assert_allclose(got["floor_mean_abs"].values, floor, rtol=1e-12)
    np.testing.assert_allclose(got["floor_max_abs"].values, np.nanmax(np.abs(delta), axis=axis), rtol=1e-12)
    np.testing.assert_allclose(table["gap_mean_abs_d"].values, gap, rtol=1e-12)
    np.testing.assert_allclose(got["share_of_gap"].values, floor / gap, rtol=1e-12)
    assert float(got["relative_throughput"]) == pytest.approx(2.0)  # a property of the whole rescoring


def test_tables_of_whole_arms_take_no_dim():
    """A table whose every number is a property of a whole arm has no ``dim=`` (issue 35 removed the
    parameter that was accepted only to be refused): Python refuses it, a dashboard as an option the
    peer does not have."""
    tr = synthetic_trace(n_sequences=4, max_len=6)
    calls = {
        "ablation_table": lambda: ablation_table(example_path("h100-ablation"), dim="position"),
        "batch_summary": lambda: batch_summary(tr, dim="sequence"),
        "batch_table": lambda: batch_table({"a": tr}, dim="sequence"),
        "inflight_table": lambda: inflight_table(example_path("h200-inflight"), dim="position"),
        "step_metrics": lambda: step_metrics(tr, dim="position"),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match="unexpected keyword argument 'dim'"):
            call()
    with pytest.raises(ValueError, match=r"verl has no option \['dim'\]"):
        as_dashboard(tr, "verl", dim="sequence")
