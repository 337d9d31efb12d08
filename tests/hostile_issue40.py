"""Issue 40's hostile inputs (all but the lazy-path class): one row per case, each either clean
(refused with exit 2 / a ValueError naming what is wrong, or no verdict on nothing) or not.

``python tests/hostile_issue40.py`` (this checkout, or any other on PYTHONPATH) prints every row
and the count of rows that are not clean; ``tests/test_bad_inputs.py`` asserts that count is 0.
Command lines run under :mod:`cli_guard` (no vLLM import, no model built, no engine made before
the refusal) in one subprocess; the rest run in this process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


@dataclass
class Cli:
    id: str
    argv: list[str]          # "{w}" is the work folder
    says: str                # regex the one line must match
    out: str | None = None   # a path (under {w}) that must not exist after the refusal


def cli_rows() -> list[Cli]:
    return [
        Cli("floor on a missing path", ["floor", "{w}/no/such/store"], r"is not a store.*experiment floors"),
        Cli("floor on a model name", ["floor", "tiny"], r"tiny is not a store.*experiment floors --model"),
        Cli("experiment floors --device tpu", ["experiment", "floors", "--out", "{w}/o0", "--device", "tpu"],
            r"--device.*'tpu'.*cpu, cuda or cuda:N", "{w}/o0"),
        Cli("ablate (moved)", ["ablate", "--out", "{w}/o6"], r"rlparity experiment ablation", "{w}/o6"),
        Cli("layers run --device tpu", ["layers", "run", "--out", "{w}/o1.zarr", "--device", "tpu"], r"--device",
            "{w}/o1.zarr"),
        Cli("verify-weights --trainer garbage", ["verify-weights", "{w}/model", "--trainer", "{w}/garbage.safetensors"],
            r"--trainer .*not a safetensors file"),
        Cli("verify-weights --trainer of another model", ["verify-weights", "{w}/model", "--trainer",
                                                          "{w}/foreign.safetensors"], r"none of its 1 tensor names"),
        Cli("verify-weights on a missing model path", ["verify-weights", "{w}/no/such/model"], r"no such model"),
        Cli("verify-weights on an unknown model name", ["verify-weights", "nosuchmodel"],
            r"nosuchmodel: no local checkpoint"),
        Cli("layers run --scenarios ','", ["layers", "run", "--out", "{w}/o2.zarr", "--scenarios", ","],
            r"--scenarios.*empty item", "{w}/o2.zarr"),
        Cli("experiment faults --arms 'clean,,raw_logprobs+'", ["experiment", "faults", "--out", "{w}/o3", "--arms",
                                                                "clean,,raw_logprobs+"], r"empty arm", "{w}/o3"),
        Cli("experiment faults --arms 'raw_logprobs+'", ["experiment", "faults", "--out", "{w}/o3b", "--arms",
                                                         "raw_logprobs+"], r"empty arm", "{w}/o3b"),
        Cli("experiment ablation --batch-sizes 0,-1", ["experiment", "ablation", "--out", "{w}/o4", "--batch-sizes",
                                                       "0,-1"], r"--batch-sizes.*positive integers", "{w}/o4"),
        Cli("gallery --n-prompts -3", ["gallery", "--out", "{w}/o5", "--n-prompts", "-3"], r"--n-prompts", "{w}/o5"),
        Cli("experiment faults --out a folder of user files", ["experiment", "faults", "--out", "{w}/userdir"],
            r"--out .*userdir: a folder of other files"),
        Cli("experiment floors --out a file", ["experiment", "floors", "--out", "{w}/afile"], r"--out .*afile: a file"),
        Cli("experiment inflight --out a file", ["experiment", "inflight", "--out", "{w}/afile"], r"--out .*a file"),
        Cli("gallery --parts ablation --ablation-knobs bogus", ["gallery", "--out", "{w}/o6", "--parts", "ablation",
                                                                "--ablation-knobs", "bogus"],
            r"--ablation-knobs: unknown \['bogus'\]", "{w}/o6"),
        Cli("gallery --parts ','", ["gallery", "--out", "{w}/o7", "--parts", ","], r"--parts.*empty item", "{w}/o7"),
        Cli("layers show on arms without profiles", ["layers", "show", "{w}/plain.zarr"], r"holds no layer profile"),
        Cli("score --device tpu", ["score", "{w}/plain.zarr", "--device", "tpu"], r"--device"),
        Cli("experiment floors --shapes 'batch1,'", ["experiment", "floors", "--out", "{w}/o8", "--shapes", "batch1,"],
            r"--shapes.*empty item", "{w}/o8"),
    ]


def fixtures(w: Path) -> None:
    """The files the command lines point at."""
    import torch
    from safetensors.torch import save_file

    from rlparity import trace as T
    from rlparity.testing import synthetic_trace

    T.save({"a": synthetic_trace(seed=3)}, w / "plain.zarr")
    (w / "garbage.safetensors").write_bytes(b"not a safetensors file" * 10)
    save_file({"foo.bar": torch.zeros(2)}, str(w / "foreign.safetensors"))
    (w / "model").mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(w / "model" / "model.safetensors"))
    (w / "userdir").mkdir()
    (w / "userdir" / "notes.txt").write_text("three weeks of notes")
    (w / "afile").write_text("a file")


def one_line_refusal(code: int, stderr: str, says: str) -> str | None:
    """Why a command's answer is not a clean refusal (None: it is)."""
    lines = [x for x in stderr.splitlines() if x.strip()]
    if code != 2:
        return f"exit {code}: {' / '.join(lines)[:300]}"
    if len(lines) != 1 or not lines[0].startswith("rlparity: error: "):
        return f"not one line: {lines[:4]}"
    if not re.search(says, lines[0]):
        return f"message {lines[0][:300]!r} does not match {says!r}"
    return None


def run_cli_rows(w: Path) -> dict[str, str | None]:
    rows = cli_rows()
    cases = [[a.replace("{w}", str(w)) for a in r.argv] for r in rows]
    (w / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    res = subprocess.run([sys.executable, str(HERE / "cli_guard.py"), str(w / "cases.json")], env=env,
                         capture_output=True, text=True, cwd=w, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = {}
    for r, got in zip(rows, json.loads(res.stdout)):
        why = one_line_refusal(got["code"], got["stderr"], r.says)
        if why is None and r.out and Path(r.out.replace("{w}", str(w))).exists():
            why = f"left {r.out} behind"
        out[r.id] = why
    return out


# ----------------------------------------------------------------------------- in-process rows


def _raises(fn: Callable[[], object], error: type[BaseException], says: str) -> str | None:
    try:
        got = fn()
    except error as err:
        return None if re.search(says, str(err)) else f"{type(err).__name__} {str(err)[:200]!r} !~ {says!r}"
    except Exception as err:  # noqa: BLE001 - the wrong kind of error is the finding
        return f"{type(err).__name__}: {str(err)[:200]}"
    return f"accepted: {str(got)[:120]}"


def _profile(nan: bool = False, n_seq: int = 3):
    from rlparity.trace.layers import layer_dataset, sites

    s = sites(2)
    rng = np.random.default_rng(0)
    state = rng.uniform(0.5, 2.0, size=(len(s), n_seq, 6))
    diff = np.full_like(state, np.nan) if nan else state * 1e-6
    ids = [[int(t) for t in rng.integers(4, 30, size=6)] for _ in range(n_seq)]
    return layer_dataset(s, diff, state, ids, [0] * n_seq, floor=np.full(len(s), 1e-6),
                         attrs={"comparison": "trainer", "path": "eager"})


def _not_judged(ds) -> str | None:
    from rlparity.diagnose.layers import divergence_start

    f = divergence_start(ds)
    return None if f is not None and f.name == "layers_not_judged" else f"verdict {getattr(f, 'name', f)}"


def _routes(value: int, num_experts: int | None = 8):
    from rlparity.testing import synthetic_trace

    b = synthetic_trace(seed=3)
    m = b["response_mask"].values
    rng = np.random.default_rng(0)
    s, t = m.shape
    eng = np.stack([rng.permutation(8)[:2] for _ in range(s * t * 2)]).reshape(s, t, 2, 2)
    eng[~m] = -1
    ds = b.assign_coords(moe_layer=[0, 1], expert_slot=[0, 1])
    dims = ("sequence", "position", "moe_layer", "expert_slot")
    ds["trainer_routed_experts"] = (dims, eng.copy())
    eng[0, 0, 0, 0] = value
    ds["routed_experts"] = (dims, eng)
    if num_experts:
        ds.attrs["routing_capture"] = {"num_experts": num_experts}
    return ds


def _weights_equal(a, b) -> bool:
    import torch

    from rlparity.trace.weights import checksums, compare_checksums

    return compare_checksums(checksums([("w", torch.tensor(a))]), checksums([("w", torch.tensor(b))]))["equal"]


def _generic_null(w: Path) -> str | None:
    import rlparity.importers as rio

    d = w / "generic_null"
    d.mkdir()
    row = {"input_ids": [5, 6, 7, 8], "prompt_length": 2, "rollout_log_probs": [-0.5, -0.7],
           "old_log_probs": [None, -0.7], "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    (d / "rows.jsonl").write_text(json.dumps(row) + "\n")
    return _raises(lambda: rio.import_to_store("generic", d / "rows.jsonl", w / "null.zarr", progress=False),
                   ValueError, r"old_log_probs is NaN at token.*missing value")


def _slime_without_torch(w: Path) -> str | None:
    code = ("import sys; sys.modules['torch'] = None\nfrom rlparity.cli.main import main\n"
            f"sys.exit(main(['import', 'slime', {str(HERE / 'data/io/slime/debug')!r}, '-o', "
            f"{str(w / 'slime.zarr')!r}, '--no-progress']))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return one_line_refusal(res.returncode, res.stderr, r"needs torch")


def _matrix(device: str):
    from rlparity.experiments.faults import MatrixSettings

    return MatrixSettings(device=device)


def _gallery(w: Path, **kw):
    """The gallery's own check, before it builds a model (the row fails if it gets that far)."""
    from rlparity.experiments.gallery import gallery

    return gallery(w / "gallery", device=kw.pop("device", "cpu"), size="no-such-size", **kw)


def api_rows(w: Path) -> dict[str, Callable[[], str | None]]:
    from rlparity.testing import synthetic_trace
    from rlparity.trace import TraceValidationError

    base = synthetic_trace(seed=3)
    unscored = base.drop_vars(["trainer_logprob", "trainer_processed_logprob"])

    def diagnose(ds):
        from rlparity.diagnose import diagnose as d

        return d(ds)

    def metrics_floor(a, b):
        from rlparity.metrics.floors import trainer_floor

        return trainer_floor(a, b)

    def floor_table():
        from rlparity.datasets import load_floor_table

        return load_floor_table("h200-floors-small", reference="nope").attrs["reference"]

    def example(name):
        from rlparity.datasets import load_example

        return load_example(name)

    def validate(ds):
        from rlparity.trace import validate as v

        return v(ds)

    def incomplete_profile():
        from rlparity.diagnose.layers import divergence_start

        return divergence_start(_profile().drop_vars("layer_floor"))

    return {
        "diagnose a trace without rollout_logprob": lambda: _raises(
            lambda: diagnose(base.drop_vars("rollout_logprob")), ValueError, r"missing rollout variables"),
        "trainer_floor on an unscored trace": lambda: _raises(lambda: metrics_floor(unscored, base), ValueError,
                                                              r"no trainer side"),
        "divergence_start on an incomplete profile": lambda: _raises(incomplete_profile, ValueError,
                                                                     r"layer profile is incomplete.*layer_floor"),
        "divergence_start, every difference NaN": lambda: _not_judged(_profile(nan=True)),
        "divergence_start, zero layer sequences": lambda: _not_judged(_profile(n_seq=0)),
        "all-NaN weights are not equal": lambda: None if not _weights_equal([float("nan")] * 3, [float("nan")] * 3)
        else "compared as equal",
        "+0.0 and -0.0 are the same weight": lambda: None if _weights_equal([0.0, 1.0], [-0.0, 1.0])
        else "compared as different",
        "route id -7": lambda: _raises(lambda: validate(_routes(-7)), TraceValidationError, r"outside 0 \.\. 7"),
        "route id 999": lambda: _raises(lambda: validate(_routes(999)), TraceValidationError, r"outside 0 \.\. 7"),
        "route id -7 without the expert count": lambda: _raises(lambda: validate(_routes(-7, None)),
                                                                TraceValidationError, r"expert id"),
        "load_floor_table(reference='nope')": lambda: _raises(floor_table, ValueError, r"'nope' is not a shape"),
        "load_example('../examples/cpu-head')": lambda: _raises(lambda: example("../examples/cpu-head"), ValueError,
                                                               r"no example"),
        "load_example('/abs/path')": lambda: _raises(lambda: example(str(HERE.parent / "rlparity/data/examples/"
                                                                         "cpu-head")), ValueError, r"no example"),
        "MatrixSettings(device='tpu')": lambda: _raises(lambda: _matrix("tpu"), ValueError, r"'tpu' is not one"),
        "gallery(device='tpu')": lambda: _raises(lambda: _gallery(w, device="tpu"), ValueError,
                                                              r"'tpu' is not one"),
        "gallery(ablation_knobs=['bogus'])": lambda: _raises(lambda: _gallery(w, ablation_knobs=["bogus"]),
                                                             ValueError, r"unknown ablation knob"),
        "generic dump with a null trainer logprob": lambda: _generic_null(w),
        "slime .pt without torch": lambda: _slime_without_torch(w),
    }


def run_all() -> dict[str, str | None]:
    """Every row: ``{id: None (clean) or why not}``."""
    with tempfile.TemporaryDirectory(prefix="hostile40-") as tmp:
        w = Path(tmp)
        fixtures(w)
        out = run_cli_rows(w)
        for name, check in api_rows(w).items():
            try:
                out[name] = check()
            except Exception as err:  # noqa: BLE001 - a crash in a row is a row that is not clean
                out[name] = f"crashed: {type(err).__name__}: {str(err)[:200]}"
        return out


if __name__ == "__main__":
    results = run_all()
    for name, why in results.items():
        print(f"{'clean' if why is None else 'NOT CLEAN':<9}  {name}" + ("" if why is None else f"  -- {why}"))
    bad = sum(why is not None for why in results.values())
    print(f"{bad} of {len(results)} rows not clean")
