"""Bisect's report as a ranked table and a figure (chapter 2, issue 38): the rows, ranks, merges and
refusals of :func:`rlparity.metrics.replay.bisect_table` against reports written by hand, and what
:func:`rlparity.plot.path.plot_bisect_ranking` draws of them. No engine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlparity.metrics.replay import bisect_table

UNIT = 1e-7


def _row(knob, mean_abs, share, *, explained=None, kind=None, top=()):
    row = {"knob": knob, "mean_abs": mean_abs, "max_abs": 2 * mean_abs, "share_moved": share,
           "n_moved": int(share * 10), "floor_units": mean_abs / UNIT, "unit": UNIT, "top_tokens": list(top), "trainer_gap": None,
           "explained": explained}
    return row if kind is None else {**row, "kind": kind}


def _report(rows, not_run=(), n_tokens=10, mode="prefill", **extra):
    return {"mode": mode, "knobs": rows, "not_run": list(not_run),
            "floor": {"n_tokens": n_tokens, "mean_abs": 0.0, "max_abs": 0.0},
            "replay_vs_capture": {"n_tokens": n_tokens, "mean_abs": 2e-7, "max_abs": 5e-7},
            "engine_starts": len(rows), "wall_s": 10.0, **extra}


def test_rows_are_ranked_by_floor_units_then_share_then_name_and_not_run_follow():
    # by hand: 3e-3 nats = 3e4 units first; two rows of 0 units: the larger share (0.2) first; then the names
    rows = [_row("eager", 0.0, 0.2), _row("max_num_seqs", 0.0, 0.0), _row("chunked_prefill", 0.0, 0.0),
            _row("head_precision", 3e-3, 0.9, explained=0.99, top=[{"token_id": 7, "token_text": "*", "delta": -0.25}])]
    na = {"knob": "attention_backend", "status": "not_applicable", "reason": "vLLM resolves it away"}
    t = bisect_table(_report(rows, [na], winner={"arm": "knob_head_precision"},
                             trainer_gap={"capture": 0.02, "baseline": 0.02}))
    assert list(t["knob"].values) == ["head_precision", "eager", "chunked_prefill", "max_num_seqs", "attention_backend"]
    assert list(t["rank"].values) == [1, 2, 3, 4, 0]
    assert list(t["status"].values) == ["ran"] * 4 + ["not_applicable"]
    assert t["reason"].values[-1] == "vLLM resolves it away" and t["reason"].values[0] == ""
    assert float(t["floor_units"].sel(knob="head_precision")) == pytest.approx(3e4, rel=1e-12)
    assert float(t["explained"].sel(knob="head_precision")) == 0.99
    assert math.isnan(float(t["explained"].sel(knob="eager")))  # no trainer numbers for it: NaN, not 0
    assert math.isnan(float(t["floor_units"].sel(knob="attention_backend")))
    assert t["worst_token"].sel(knob="head_precision").item() == "'*' -0.25"
    assert list(t["kind"].values) == ["knob"] * 5
    assert t.attrs["winner"] == "knob_head_precision" and t.attrs["unit"] == UNIT and t.attrs["n_tokens"] == 10
    assert t.attrs["replay_max_abs"] == 5e-7 and t.attrs["trainer_gap_capture"] == 0.02


def test_two_reports_of_the_same_tokens_rank_together():
    a = _report([_row("head_precision", 5e-3, 0.6), _row("async_scheduling", 0.0, 0.0)])
    b = _report([_row("eager", 1e-3, 0.5)], [{"knob": "prefix_cache_warm", "status": "not_applicable", "reason": "x"},
                                             {"knob": "eager", "status": "skipped", "reason": "budget"}])
    t = bisect_table(a, b)
    assert list(t["knob"].values) == ["head_precision", "eager", "async_scheduling", "prefix_cache_warm"]
    assert list(t["rank"].values) == [1, 2, 3, 0]  # eager ran in b: its skipped entry elsewhere is no row
    assert t.attrs["engine_starts"] == 3 and t.attrs["wall_s"] == 20.0 and t.attrs["reports"] == 2
    assert t.attrs["winner"] is None  # each report named its own winner
    pair = bisect_table(_report([_row("eager+head_precision", 1e-3, 0.5)]))
    assert pair["kind"].item() == "pair"


def test_reports_of_other_tokens_or_floors_are_refused():
    a = _report([_row("eager", 1e-3, 0.5)])
    with pytest.raises(ValueError, match="report 1 replayed 11 tokens .*only reports of the same tokens and floor"):
        bisect_table(a, _report([_row("head_precision", 1e-3, 0.5)], n_tokens=11))
    with pytest.raises(ValueError, match="only reports of the same tokens and floor"):
        bisect_table(a, _report([_row("head_precision", 1e-3, 0.5)], mode="decode"))
    with pytest.raises(ValueError, match="a knob ran in two reports .eager."):
        bisect_table(a, a)
    with pytest.raises(ValueError, match="report 0 has no knobs"):
        bisect_table({"floor": {}, "replay_vs_capture": {}})


def test_a_report_where_nothing_ran_takes_the_floor_as_its_unit():
    from rlparity.config.defaults import defaults

    t = bisect_table(_report([], [{"knob": "eager", "status": "skipped", "reason": "budget"}]))
    assert t.attrs["unit"] == defaults().replay_floor_min and list(t["rank"].values) == [0]
    rep = _report([])
    rep["floor"]["mean_abs"] = 3e-6
    assert bisect_table(rep).attrs["unit"] == 3e-6
    assert bisect_table(rep).attrs["engine_starts"] == 0 and bisect_table(rep).attrs["winner"] is None


def test_the_figure_draws_every_row_on_a_log_axis_and_greys_what_did_not_run():
    from rlparity.plot.path import plot_bisect_ranking

    t = bisect_table(_report([_row("head_precision", 3e-3, 0.9, explained=0.99), _row("eager", 0.0, 0.0)],
                             [{"knob": "attention_backend", "status": "not_applicable", "reason": "why"}]))
    fig = plot_bisect_ranking({"CPU": t, "GPU": t})
    bars = [d for d in fig.data if d.name == "shift in floor units"]
    grey = [d for d in fig.data if d.name == "did not run"]
    assert len(bars) == len(grey) == 2
    x = np.asarray(bars[0].x, dtype=float)
    assert x[0] == pytest.approx(3e4) and x[1] == 0.1 and np.isnan(x[2])  # 0 units drawn at 0.1, labelled 0
    assert bars[0].text[:2] == ("3e+04, closes 0.99", "0")
    assert list(np.isnan(np.asarray(grey[0].x, dtype=float))) == [True, True, False]
    assert grey[0].customdata[2] == "why"
    assert fig.layout.xaxis.type == fig.layout.xaxis2.type == "log"


def test_an_unknown_plant_is_refused_before_any_engine():
    from rlparity.experiments.planted_bisect import PLANTS, planted_bisect

    with pytest.raises(ValueError, match="plant 'fp8_head': use one of bf16_head"):
        planted_bisect("no-model-needed", plant="fp8_head")
    assert PLANTS["bf16_head"] == {"head_dtype": "bfloat16"}
