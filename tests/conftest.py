"""Shared fixtures: the tiny model (built once, cached) and real-engine captures.

Engines are expensive (30-60 s to start on 2 cores) and only one may run at a time, so tests
never start engines themselves: they ask ``capture_trace(settings, sampling, prompts)``, which
reuses one engine per setting through the process-wide :class:`EnginePool` and caches traces.
Tests that run notebooks (another process) must call ``release_engines()`` first.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("RLPARITY_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# OpenMP threads that sleep at a barrier instead of spinning (before torch is imported, inherited by the
# notebooks' kernels and the engines): on a machine where another process is busy, torch's two spinning
# threads made a tiny-model rescoring take 33.7 s instead of 2.2 s (issue 42: a loaded `make test` ran
# 1 h 52 min; measured with load average 9-12 on the 2-core machine).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# test files that reuse another file's captures (capture_trace's cache): run right after it, so the capture is
# served from the cache instead of starting its engines again (test_check's two arms are test_engine's)
RUN_AFTER = {"test_check.py": "test_engine.py"}


def order_for_shared_captures(items: list) -> list:
    """``items`` with each file of :data:`RUN_AFTER` moved to right after the file whose captures it reuses
    (the rest keep their order; a file whose partner is not collected stays where it was)."""
    def name(item):
        return Path(str(item.fspath)).name

    moved = {f: [i for i in items if name(i) == f] for f in RUN_AFTER}
    out = [i for i in items if name(i) not in RUN_AFTER or not any(name(j) == RUN_AFTER[name(i)] for j in items)]
    for f, group in moved.items():
        if group and group[0] not in out:
            last = max(k for k, i in enumerate(out) if name(i) == RUN_AFTER[f])
            out[last + 1:last + 1] = group
    return out


def pytest_collection_modifyitems(config, items):
    items[:] = order_for_shared_captures(items)
    if in_lane("light"):
        # the book waits for the engine lane's notebooks: last, after this lane's own tests
        items[:] = sorted(items, key=lambda i: Path(str(i.fspath)).name == "test_book.py")
    if in_lane("engine"):
        # the notebooks first, so the other lane builds the book while this one runs the rest
        items[:] = sorted(items, key=lambda i: Path(str(i.fspath)).name != "test_notebooks.py")
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _engines_need_the_engine_marker(request, monkeypatch):
    """A test that starts a vLLM engine in this process without ``@pytest.mark.engine`` fails at
    the start, so ``-m "not engine"`` really leaves every engine out (a marker is not a comment)."""
    if request.node.get_closest_marker("engine") is not None:
        yield
        return
    import functools

    from rlparity.capture import lifecycle, server

    def refusing(original):
        @functools.wraps(original)  # keeps the docstring: test_api_docs reads the API while this runs
        def refuse(*args, **kwargs):
            raise RuntimeError(f"{request.node.nodeid} starts a vLLM engine but is not marked @pytest.mark.engine")
        return refuse

    monkeypatch.setattr(lifecycle, "engine_session", refusing(lifecycle.engine_session))
    monkeypatch.setattr(server.Server, "start", refusing(server.Server.start))
    yield


class CliResult:
    """What one ``rlparity`` invocation did: exit code, stdout, stderr (``output`` = both)."""

    def __init__(self, code: int, out: str, err: str):
        self.exit_code, self.stdout, self.stderr = code, out, err
        self.output = out + err


def run_cli(*args) -> CliResult:
    """Run ``rlparity ARGS`` in-process through the real entry point (exit-code contract included).
    The engines' logging choice the CLI makes for its process is undone after the call, so later
    engines of the test process do not log under this call's working directory."""
    import contextlib
    import io

    from rlparity.cli import main
    from rlparity.config import logs

    keys = ("VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_STREAM", *logs.QUIET_ENV)
    choice, ours, env = dict(logs._CHOICE), set(logs._OURS), {k: os.environ.get(k) for k in keys}
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        logs._CHOICE.clear()
        logs._CHOICE.update(choice)
        logs._OURS.clear()
        logs._OURS.update(ours)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return CliResult(code, out.getvalue(), err.getvalue())


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` with a hash of its content (links by their target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="session")
def cli():
    """``cli("summary", store)`` -> :class:`CliResult` (see :func:`run_cli`)."""
    return run_cli


@pytest.fixture(scope="session")
def tiny_model():
    from rlparity.models import make_model

    return str(make_model("tiny", progress=False))


@pytest.fixture(scope="session")
def prompts():
    from rlparity.models import make_prompts

    return make_prompts(16, seed=0)


def fp32_parity_settings():
    """pipelinerl-parity with an fp32 body: the setting backends are compared under."""
    from rlparity.capture import EngineSettings

    return EngineSettings(logprobs_mode="processed_logprobs", enable_prefix_caching=False,
                          head_dtype="float32", dtype="float32", generation_config="vllm")


def fp32_parity_sampling():
    from rlparity.capture import SamplingSettings

    return SamplingSettings(temperature=0.7, top_k=20, max_tokens=16, seed=0)


@pytest.fixture(scope="session")
def prompts8():
    from rlparity.models import make_prompts

    return make_prompts(8, seed=0)


@pytest.fixture(scope="session")
def offline_fp32_trace(tiny_model, pool, prompts8):
    """The offline engine's capture that other backends (AsyncLLM, vllm serve) must reproduce."""
    return pool.get(tiny_model, fp32_parity_settings()).capture(prompts8, fp32_parity_sampling(),
                                                                arm="offline", progress=False)


@pytest.fixture(scope="session")
def pool():
    from rlparity.capture.pool import shared_pool

    p = shared_pool()
    yield p
    p.close()


@pytest.fixture(scope="session")
def release_engines(pool):
    """Call to shut the live engine down before another process needs one."""
    return pool.close


@pytest.fixture(scope="session")
def scorer_fp32(tiny_model):
    from rlparity.score import Scorer

    return Scorer(tiny_model, dtype="float32", head_dtype="float32", progress=False)


@pytest.fixture(scope="session")
def capture_trace(tiny_model, pool, prompts):
    """capture_trace(engine_settings, sampling, prompts=None) -> rollout trace (cached)."""
    cache: dict = {}

    def _capture(settings=None, sampling=None, prompt_list=None, arm="test"):
        from rlparity.capture import EngineSettings, SamplingSettings

        settings = settings or EngineSettings()
        sampling = sampling or SamplingSettings(temperature=0.7, top_k=20, max_tokens=24)
        plist = prompt_list if prompt_list is not None else prompts
        key = (settings.model_dump_json(), repr(sampling), repr(plist), arm)
        if key not in cache:
            cache[key] = pool.get(tiny_model, settings).capture(plist, sampling, arm=arm,
                                                               progress=False)
        return cache[key]

    return _capture


ARTIFACTS = os.path.join(os.path.dirname(__file__), "..", "artifacts", "notebooks")


# notebooks that start no vLLM engine with ci=True (they read shipped example data): run in the lane without
# engines (test_lanes.py fails the run if one takes an engine lock there)
ENGINE_FREE_NOTEBOOKS = ("11_doctor",)
# scripts/test_lanes.py: the lane this process is ("engine" or "light") and the folder where the engine lane
# says which notebooks it executed (NAME.json: its out_dir; NAME.failed; engine-lane.done once it ended)
LANE = os.environ.get("RLPARITY_LANE")
LANE_NOTEBOOKS = os.environ.get("RLPARITY_LANE_NOTEBOOKS")
LANE_WAIT_S = float(os.environ.get("RLPARITY_LANE_WAIT_S", 4 * 3600))


def in_lane(lane: str) -> bool:
    """Whether this process is lane ``lane`` (``"engine"`` or ``"light"``) of ``scripts/test_lanes.py``."""
    return LANE == lane and bool(LANE_NOTEBOOKS)


def book_in_light_lane() -> bool:
    """Under ``scripts/test_lanes.py`` the book (tests/test_book.py: sphinx on the executed notebooks, no engine)
    is built in the lane without engines from the notebooks the engine lane executed.

    True in either lane (not :func:`in_lane` ``("light")``): the book then carries no ``engine`` marker, so the
    engine lane (``-m engine``) leaves it out and the light lane (``-m "not engine"``) runs it."""
    return bool(LANE and LANE_NOTEBOOKS)


def _published(name: str) -> Path:
    """Wait for the engine lane to execute notebook ``name``; its ``out_dir``."""
    import json
    import time

    folder, deadline = Path(LANE_NOTEBOOKS), time.monotonic() + LANE_WAIT_S
    while True:
        ended = (folder / "engine-lane.done").exists()  # first: all the engine lane published came before it
        if (folder / f"{name}.json").exists():
            return Path(json.loads((folder / f"{name}.json").read_text())["out_dir"])
        if (folder / f"{name}.failed").exists():
            pytest.fail(f"notebook {name} failed in the engine lane: {(folder / f'{name}.failed').read_text()[-2000:]}")
        if ended or time.monotonic() > deadline:
            pytest.fail(f"the engine lane ended (or {LANE_WAIT_S:g} s passed) without executing notebook {name}")
        time.sleep(2)


def _publish(name: str, out_dir: Path | None, error: BaseException | None = None) -> None:
    import json

    if not in_lane("engine"):
        return
    folder = Path(LANE_NOTEBOOKS)
    if error is not None:
        (folder / f"{name}.failed").write_text(f"{type(error).__name__}: {error}")
        return
    tmp = folder / f".{name}.json"
    tmp.write_text(json.dumps({"out_dir": str(out_dir)}))
    tmp.rename(folder / f"{name}.json")  # whole or absent for the lane that waits


@pytest.fixture(scope="session")
def executed_notebook(release_engines, tmp_path_factory):
    """executed_notebook("01_semantic") -> out_dir of that notebook run once with ci=True.

    The executed notebook is kept in ``artifacts/notebooks/`` (CI artifacts); its ``out_dir``
    (results.json, zarr stores) is a temporary folder. Runs each notebook once per session.
    ``RLPARITY_EXECUTED_NOTEBOOKS=DIR`` reuses notebooks already executed from the same sources
    (``DIR/NAME.ipynb``, its ``out_dir`` ``DIR/out/NAME``) instead of running them again: the book's
    checks on a machine where a run of all ten takes 20 minutes.
    Under ``scripts/test_lanes.py`` the lane without engines (the book) waits for a notebook that starts
    engines to be executed by the engine lane (same ``artifacts/notebooks/``) instead of running it.
    """
    import shutil

    from rlparity.cli.notebooks import NOTEBOOKS, run_notebook

    done: dict = {}
    reuse = os.environ.get("RLPARITY_EXECUTED_NOTEBOOKS")

    def _run(name: str):
        if name not in done and reuse and os.path.exists(os.path.join(reuse, f"{name}.ipynb")):
            os.makedirs(ARTIFACTS, exist_ok=True)
            shutil.copyfile(os.path.join(reuse, f"{name}.ipynb"), os.path.join(ARTIFACTS, f"{name}.ipynb"))
            done[name] = Path(reuse) / "out" / name
        if name not in done and in_lane("light") and name not in ENGINE_FREE_NOTEBOOKS:
            done[name] = _published(name)
        if name not in done:
            release_engines()  # the kernel is another process and needs the engine lock
            out_dir = tmp_path_factory.mktemp(name)
            try:
                run_notebook(NOTEBOOKS / f"{name}.py", os.path.join(ARTIFACTS, f"{name}.ipynb"), out_dir)
            except BaseException as err:
                _publish(name, None, err)
                raise
            _publish(name, out_dir)
            done[name] = out_dir
        return done[name]

    return _run
