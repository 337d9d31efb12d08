"""One exit-code contract for every command: 0 pass/ok, 1 parity broken or settings differ,
2 bad input (one line on stderr naming what is wrong and how to fix it, no traceback), 3 internal
error (traceback only with --debug). JSON output is strict (no bare NaN). Table-driven; no engine
starts (bad settings are refused before one would)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlparity.testing import synthetic_trace
from rlparity.trace import save


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: bare {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    good = save({"processed": synthetic_trace(arm="processed")}, d / "good.zarr")
    raw = save({"raw": synthetic_trace(logprobs_mode="raw_logprobs", arm="raw")}, d / "raw.zarr")
    one = save({"one": synthetic_trace(n_sequences=1, max_len=1, arm="one")}, d / "one.zarr")
    user = d / "user_files"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    bad_yaml = d / "bad.yaml"
    bad_yaml.write_text("max_abs_log_ratio_mean: [0.1\n")
    no_settings = synthetic_trace(arm="bare").assign_attrs(engine_effective={"unrelated": 1})
    bare = save({"bare": no_settings}, d / "bare.zarr")
    return {"good": good, "raw": raw, "one": one, "user": user, "bad_yaml": bad_yaml, "bare": bare, "dir": d}


# (name, argv builder, exit code, text that must appear in stderr (2/3) or stdout (0/1))
ROWS = [
    ("summary ok", lambda s: ["summary", s["good"]], 0, "parity summary"),
    ("summary of a missing store", lambda s: ["summary", s["dir"] / "missing.zarr"], 2, "missing.zarr"),
    ("summary of a folder of user files", lambda s: ["summary", s["user"]], 2, "user_files"),
    ("summary --trainer foo", lambda s: ["summary", s["good"], "--trainer", "foo"], 2, "foo"),
    ("summary of an unknown arm", lambda s: ["summary", s["good"], "--arm", "nope"], 2, "no arm(s) ['nope']"),
    ("diagnose raw: broken", lambda s: ["diagnose", s["raw"]], 1, "raw_logprobs_used_as_processed"),
    ("diagnose processed: ok", lambda s: ["diagnose", s["good"]], 0, "parity: no problem found"),
    ("diagnose with an unknown reference", lambda s: ["diagnose", s["good"], "--reference", "x"], 2, "not an arm"),
    ("check processed: pass", lambda s: ["check", s["good"]], 0, "PASS"),
    ("check raw: fail", lambda s: ["check", s["raw"]], 1, "FAIL"),
    ("check with a YAML syntax error", lambda s: ["check", s["good"], "--thresholds", s["bad_yaml"]], 2,
     "not valid YAML"),
    ("check with neither trace nor model", lambda s: ["check"], 2, "either a TRACE"),
    ("capture temperature -1", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--temperature", "-1"], 2,
     "--temperature: Input should be greater than or equal to 0"),
    ("capture temperature inf", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--temperature", "inf"], 2,
     "--temperature"),
    ("capture top_p 1.5", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--top-p", "1.5"], 2,
     "--top-p: Input should be less than or equal to 1"),
    ("capture --engine '[1,2]'", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--engine", "[1,2]"], 2,
     "--engine must be a JSON object"),
    ("capture --engine not JSON", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--engine", "{x"], 2,
     "--engine is not JSON"),
    ("capture --engine unknown key", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--engine",
                                               '{"prefix_cache": true}'], 2, "prefix_cache"),
    ("capture --profile nope", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--profile", "nope"], 2,
     "unknown profile 'nope'"),
    ("audit of a trace that records none of the profile's settings", lambda s: ["audit", s["bare"]], 2,
     "nothing was audited"),
    ("profiles nope", lambda s: ["profiles", "nope"], 2, "unknown profile"),
    ("import unknown format", lambda s: ["import", "x", s["dir"], "-o", s["dir"] / "i.zarr"], 2, "unknown format"),
    ("unknown command", lambda s: ["frobnicate"], 2, "frobnicate"),
    ("examples of an unknown name", lambda s: ["examples", "nope"], 2, "no example 'nope'"),
]


@pytest.mark.parametrize("name, argv, code, text", ROWS, ids=[r[0] for r in ROWS])
def test_exit_code_contract(name, argv, code, text, stores, cli):
    before = sorted(p.name for p in stores["user"].iterdir())
    res = cli(*argv(stores))
    assert res.exit_code == code, (name, res.exit_code, res.output[-2000:])
    where = res.stderr if code in (2, 3) else res.stdout
    assert text in where, (name, where[-2000:])
    if code == 2:
        lines = [line for line in res.stderr.splitlines() if line.strip() and "WARNING" not in line]
        assert "Traceback" not in res.stderr, res.stderr
        assert len(lines) <= 6, res.stderr  # a usage error prints usage + one line; ours print one line
    assert sorted(p.name for p in stores["user"].iterdir()) == before  # nothing of the user's was touched


def test_internal_errors_exit_3_with_traceback_only_under_debug(stores, cli, monkeypatch):
    import rlparity.diagnose.check as C

    def broken(*a, **k):
        raise KeyError("a bug")

    monkeypatch.setattr(C, "check", broken)
    res = cli("check", stores["good"])
    assert res.exit_code == 3 and "internal error: KeyError" in res.stderr and "--debug" in res.stderr
    assert "Traceback" not in res.stderr
    res = cli("--debug", "check", stores["good"])
    assert res.exit_code == 3 and "Traceback" in res.stderr


def test_json_output_is_strict(stores, cli):
    res = cli("summary", stores["one"], "--json")
    assert res.exit_code == 0
    data = _strict(res.stdout)
    assert data["one"]["prob_pearson"] is None  # NaN (one token) is null, never a bare NaN
    for argv in (["diagnose", stores["raw"], "--json"], ["check", stores["raw"], "--json"],
                 ["summary", stores["good"], "--names", "verl", "--json"]):
        res = cli(*argv)
        assert res.exit_code in (0, 1)
        _strict(res.stdout)


def test_nothing_to_judge_is_bad_input(stores, cli):
    empty = synthetic_trace(n_sequences=2, arm="empty")
    path = stores["dir"] / "empty.zarr"
    rows = [[] for _ in range(2)]
    from rlparity.trace import from_rollouts

    hollow = from_rollouts(prompt_token_ids=[[1, 2], [3, 4]], token_ids=rows, rollout_logprobs=rows,
                           attrs={"arm": "empty"})
    hollow = hollow.assign(trainer_logprob=(("sequence", "position"), np.zeros((2, 0))),
                           trainer_processed_logprob=(("sequence", "position"), np.zeros((2, 0))))
    save({"empty": hollow}, path)
    del empty
    for cmd in ("diagnose", "check"):
        res = cli(cmd, path)
        assert res.exit_code == 2 and "nothing to judge" in res.stderr, res.output
