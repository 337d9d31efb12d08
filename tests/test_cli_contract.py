"""One exit-code contract for every command: 0 pass/ok, 1 parity broken or settings differ,
2 bad input (one line on stderr naming what is wrong and how to fix it, no traceback), 3 internal
error (traceback only with --debug). JSON output is strict (no bare NaN). Table-driven; no engine
starts (bad settings are refused before one would)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import xarray as xr

from conftest import snapshot
from rlparity.testing import synthetic_trace
from rlparity.trace import save

FIXTURE = Path(__file__).resolve().parent / "data" / "io" / "generic" / "verl" / "rlparity_dump" / "step_5.npz"


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
    out = {"good": good, "raw": raw, "one": one, "user": user, "bad_yaml": bad_yaml, "bare": bare, "dir": d}
    yamls = {"list": "- 1\n- 2\n", "python": 'x: !!python/object/apply:os.system ["echo hi"]\n',
             "syntax": "tol: [0.1\n", "intkey": "1: 2\n", "scalar": "hello\n", "unknown": "bogus: 1\n",
             "negative": "tol: -1\n", "nested": "check: {bogus: 1}\n",
             "lax_check": "check: {fail_on: none, forbid_findings: [], max_abs_log_ratio_mean: null, "
                          "max_abs_log_ratio_rms: null, max_kl_k3: null, mean_ratio: null, max_clip_fraction: null, "
                          "max_zero_prob_share: null, max_boundary_flip_share: null}\n"}
    for name, text in yamls.items():
        (d / f"{name}.yaml").write_text(text)
        out[f"yaml_{name}"] = d / f"{name}.yaml"
    (d / "latin1.yaml").write_bytes(b"tol: 0.02 # \xe9t\xe9\n\xff\xfe")
    out["yaml_latin1"] = d / "latin1.yaml"
    (d / "a_folder.yaml").mkdir()
    out["yaml_folder"] = d / "a_folder.yaml"
    out["missing_yaml"] = d / "missing.yaml"
    out["user_file"] = user / "notes.txt"
    (d / "rl_user").mkdir()
    (d / "rl_user" / "rl.zarr").write_text("mine")  # a user's file where the store would go
    out["rl_user"] = d / "rl_user"
    out["fixture"] = FIXTURE
    # damaged stores: each is refused, never read as data
    out["huge"] = _edited(d, "huge.zarr", lambda m: m["v/trainer_processed_logprob/.zarray"].update(
        shape=[10 ** 10, 23], chunks=[1, 23]))
    out["format2"] = _edited(d, "format2.zarr", lambda m: m[".zattrs"].update(rlparity_store=2))
    out["no_record"] = _edited(d, "no_record.zarr", lambda m: m[".zattrs"].pop("rlparity_integrity"))
    gone = save({"v": synthetic_trace(seed=3)}, d / "gone.zarr")
    next(p for p in sorted((gone / "v" / "rollout_logprob").iterdir()) if not p.name.startswith(".")).unlink()
    out["gone"] = gone
    (d / "file.zarr").write_text("not a store")
    out["file_store"] = d / "file.zarr"
    xr.Dataset({"x": ("i", np.arange(3))}).to_zarr(d / "foreign.zarr", zarr_format=2, consolidated=True)
    out["foreign"] = d / "foreign.zarr"
    out["labels"] = save({"alpha": synthetic_trace(arm="same"), "beta": synthetic_trace(arm="same", seed=2)},
                         d / "labels.zarr")
    # the working directory of every row: `runs` is a file there, so a command that makes runs/logs fails
    work = d / "work"
    work.mkdir()
    (work / "runs").write_text("a file named runs")
    out["work"] = work
    return out


def _edited(d, name, change):
    """A saved store whose consolidated metadata ``change`` edits behind rlparity's back."""
    store = save({"v": synthetic_trace(seed=3)}, d / name)
    meta = json.loads((store / ".zmetadata").read_text())
    change(meta["metadata"])
    (store / ".zmetadata").write_text(json.dumps(meta))
    return store


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
    # the experiments refuse a bad choice before any model is built or --out is made
    ("experiment faults with an unknown cause",
     lambda s: ["experiment", "faults", "--out", s["dir"] / "f", "--arms", "clean,no_such_cause"], 2,
     "unknown fault(s) ['no_such_cause']"),
    ("experiment floors with an unknown trainer shape",
     lambda s: ["experiment", "floors", "--out", s["dir"] / "fl", "--shapes", "batch1,bogus"], 2,
     "--shapes: unknown ['bogus']"),
    ("experiment rl with an unknown ratio denominator",
     lambda s: ["experiment", "rl", "--out", s["dir"] / "r", "--old-policy", "nope"], 2, "--old-policy: unknown"),
    ("experiment rl with an unknown loss", lambda s: ["experiment", "rl", "--out", s["dir"] / "r", "--loss", "x"], 2,
     "--loss"),
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


def defaults_env(key):
    """``RLPARITY_DEFAULTS`` naming the fixture file ``key``."""
    return lambda s: {"RLPARITY_DEFAULTS": str(s[key])}


# issue 22: one row per class of the second trust pass (install/CLI, defaults, store, summary);
# (name, argv builder, exit code, text, environment builder or None)
ROWS_22 = [
    # RLPARITY_DEFAULTS: read inside the CLI's error handling, never a traceback at import
    ("defaults: a missing file", lambda s: ["summary", s["good"]], 2, "no such file",
     defaults_env("missing_yaml")),
    ("defaults: a folder", lambda s: ["diagnose", s["good"]], 2, "is a folder, not a YAML file",
     defaults_env("yaml_folder")),
    ("defaults: a YAML list", lambda s: ["check", s["good"]], 2, "holds a YAML list, not a mapping",
     defaults_env("yaml_list")),
    ("defaults: an unknown key", lambda s: ["summary", s["good"]], 2, "unknown default(s) ['bogus']",
     defaults_env("yaml_unknown")),
    ("defaults: a !!python tag, with --version", lambda s: ["--version"], 2,
     "uses a YAML tag rlparity does not execute", defaults_env("yaml_python")),
    ("defaults: a YAML syntax error, with --help", lambda s: ["--help"], 2, "is not valid YAML at line 2",
     defaults_env("yaml_syntax")),
    ("defaults: not UTF-8", lambda s: ["diagnose", s["good"]], 2, "is not UTF-8 text", defaults_env("yaml_latin1")),
    ("defaults: a value out of range", lambda s: ["check", s["good"]], 2, "tol: Input should be greater than 0",
     defaults_env("yaml_negative")),
    ("defaults: an unknown nested key", lambda s: ["summary", s["good"]], 2, "check.bogus: Extra inputs",
     defaults_env("yaml_nested")),
    ("defaults: a key that is not text", lambda s: ["diagnose", s["good"]], 2, "key 1 is not a name",
     defaults_env("yaml_intkey")),
    ("defaults: a bare string, with import", lambda s: ["import", "generic", s["fixture"], "-o", s["dir"] / "i.zarr"],
     2, "holds a YAML str", defaults_env("yaml_scalar")),
    ("defaults: a good file is applied (raw passes a check with no limits)", lambda s: ["check", s["raw"]], 0,
     "PASS", defaults_env("yaml_lax_check")),
    # check --thresholds
    ("thresholds: a folder", lambda s: ["check", s["good"], "--thresholds", s["yaml_folder"]], 2,
     "is a folder, not a YAML file", None),
    ("thresholds: the data folder itself", lambda s: ["check", s["good"], "--thresholds", s["dir"]], 2,
     "is a folder, not a YAML file", None),
    ("thresholds: a YAML list", lambda s: ["check", s["good"], "--thresholds", s["yaml_list"]], 2,
     "holds a YAML list", None),
    ("thresholds: a !!python tag", lambda s: ["check", s["good"], "--thresholds", s["yaml_python"]], 2,
     "does not execute", None),
    ("thresholds: not UTF-8", lambda s: ["check", s["good"], "--thresholds", s["yaml_latin1"]], 2,
     "is not UTF-8 text", None),
    ("thresholds: a missing file", lambda s: ["check", s["good"], "--thresholds", s["missing_yaml"]], 2,
     "no such file: start from", None),
    ("thresholds: a key that is not text", lambda s: ["check", s["good"], "--thresholds", s["yaml_intkey"]], 2,
     "key 1 is not a name", None),
    ("thresholds: an unknown key", lambda s: ["check", s["good"], "--thresholds", s["yaml_unknown"]], 2,
     "bogus: Extra inputs are not permitted", None),
    # --profile files, refused before any engine starts
    ("profile: a folder", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--profile", s["yaml_folder"]], 2,
     "is a folder, not a YAML file", None),
    ("profile: a YAML list", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--profile", s["yaml_list"]], 2,
     "holds a YAML list", None),
    ("profile: a !!python tag", lambda s: ["capture", "tiny", "-o", s["dir"] / "c.zarr", "--profile",
                                          s["yaml_python"]], 2, "does not execute", None),
    ("profile: a key that is not text", lambda s: ["check", "--model", "tiny", "--profile", s["yaml_intkey"]], 2,
     "key 1 is not a name", None),
    # output stores: checked before a model loads or an engine starts
    ("import -o .", lambda s: ["import", "generic", s["fixture"], "-o", "."], 2, "'.' names a folder", None),
    ("import -o .. --overwrite", lambda s: ["import", "generic", s["fixture"], "-o", "..", "--overwrite"], 2,
     "'..' names a folder", None),
    ("import -o the working directory", lambda s: ["import", "generic", s["fixture"], "-o", s["work"], "--overwrite"],
     2, "is the working directory", None),
    ("import onto a store without --overwrite", lambda s: ["import", "generic", s["fixture"], "-o", s["good"]], 2,
     "pass overwrite=True (--overwrite", None),
    ("import onto a folder of user files", lambda s: ["import", "generic", s["fixture"], "-o", s["user"],
                                                    "--overwrite"], 2, "is not an rlparity store", None),
    ("capture -o .", lambda s: ["capture", "tiny", "-o", "."], 2, "--out .: '.' names a folder", None),
    ("capture -o a user file", lambda s: ["capture", "tiny", "-o", s["user_file"]], 2,
     "is not an rlparity store (a file)", None),
    ("run -o /", lambda s: ["run", "-o", "/"], 2, "--out /: '/' names a folder", None),
    ("check --model --out .", lambda s: ["check", "--model", "tiny", "--out", "."], 2, "--out .: '.' names a folder",
     None),
    ("experiment ablation --out a folder of user files", lambda s: ["experiment", "ablation", "--out", s["user"]], 2,
     "a folder of other files (notes.txt); give a new or empty folder", None),
    ("experiment rl -o a user file", lambda s: ["experiment", "rl", "-o", s["user_file"]], 2, "a file; give a folder",
     None),
    ("a moved command says where it went", lambda s: ["rl-run", "-o", s["user_file"]], 2,
     "`rlparity rl-run` is now `rlparity experiment rl`", None),
    ("experiment rl --out a folder holding a user file as rl.zarr",
     lambda s: ["experiment", "rl", "--out", s["rl_user"]], 2, "is not an rlparity store (a file)", None),
    # stores that are not what they claim: refused at once, never read as data
    ("diagnose of a .zmetadata claiming 1e10 chunks", lambda s: ["diagnose", s["huge"]], 2,
     "9999999999 of 10000000000 chunks", None),
    ("summary of store format 2", lambda s: ["summary", s["format2"]], 2, "store format 2", None),
    ("check of a store without its integrity record", lambda s: ["check", s["no_record"]], 2, "no integrity record",
     None),
    ("check of a store with a chunk file gone", lambda s: ["check", s["gone"]], 2, "chunks of 'v/rollout_logprob'",
     None),
    ("summary of a file named .zarr", lambda s: ["summary", s["file_store"]], 2, "is a file, not an rlparity store",
     None),
    ("diagnose of a zarr store not written by rlparity", lambda s: ["diagnose", s["foreign"]], 2, "holds no arms",
     None),
    ("summary of .", lambda s: ["summary", "."], 2, "'.' names a folder", None),
    # summary labels blocks with the store's arm names, not a stale `arm` attribute
    ("summary labels arms by their store names", lambda s: ["summary", s["labels"]], 0, "arm=beta", None),
    # a base install's commands need no engine, and none makes runs/logs (runs is a file in the work folder)
    ("--version with runs a file", lambda s: ["--version"], 0, "rlparity 0.1.0", None),
    ("import with runs a file", lambda s: ["import", "generic", s["fixture"], "-o", s["dir"] / "imported.zarr",
                                          "--no-progress"], 0, "imported generic", None),
]


ALL_ROWS = [(*r, None) for r in ROWS] + ROWS_22


@pytest.mark.parametrize("name, argv, code, text, env", ALL_ROWS, ids=[r[0] for r in ALL_ROWS])
def test_exit_code_contract(name, argv, code, text, env, stores, cli, monkeypatch):
    import importlib

    D = importlib.import_module("rlparity.config.defaults")  # the module (the package exports the function)
    monkeypatch.chdir(stores["work"])
    monkeypatch.setattr(D, "_BASE", [])  # RLPARITY_DEFAULTS is read once per process: read it for this row
    for k, v in (env(stores) if env else {}).items():
        monkeypatch.setenv(k, v)
    args = argv(stores)
    made = [stores["dir"] / "imported.zarr"] if any(str(a).endswith("imported.zarr") for a in args) else []
    before = snapshot(stores["dir"])
    res = cli(*args)
    assert res.exit_code == code, (name, res.exit_code, res.output[-2000:])
    where = res.stderr if code in (2, 3) else res.stdout
    assert text in where, (name, where[-2000:])
    if code == 2:
        lines = [line for line in res.stderr.splitlines() if line.strip() and "WARNING" not in line]
        assert "Traceback" not in res.stderr, res.stderr
        assert len(lines) <= 6, res.stderr  # a usage error prints usage + one line; ours print one line
        if "rlparity: error:" in res.stderr:
            assert len(lines) == 1, res.stderr
    after = snapshot(stores["dir"])
    for p in made:  # a row that writes a new store: that store is all that changed
        assert (p.exists() and str(p.relative_to(stores["dir"])) in after), name
        after = {k: v for k, v in after.items() if not k.startswith(str(p.relative_to(stores["dir"])))}
    assert after == before, f"{name}: files changed: {sorted(set(after.items()) ^ set(before.items()))[:5]}"


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
