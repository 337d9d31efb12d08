"""The command line's shape: one root app built by a function (importing a module registers
nothing), no command module imports the entry point or the root app, commands without an engine
leave the working directory and the logging environment alone, and the command lines
``scripts/gpu_run.py`` runs parse."""

from __future__ import annotations

import ast
import inspect
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "rlparity" / "cli"
# the modules allowed to import the entry point / the root app (the entry points themselves)
ENTRY_POINTS = {"rlparity.cli.main": {"rlparity.cli"},
                "rlparity.cli.app": {"rlparity.cli", "rlparity.cli.main"}}


def _python(code_or_args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, *code_or_args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def cli_imports(folder: Path = CLI) -> dict[str, set[str]]:
    """``{module: modules it imports from rlparity}`` for every module under ``folder`` (imports
    inside functions included)."""
    out: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        module = "rlparity.cli" + ("" if path.stem == "__init__" else f".{path.stem}")
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
        out[module] = {m for m in found if m.startswith("rlparity")}
    return out


def entry_point_violations(imports: dict[str, set[str]]) -> list[str]:
    return [f"{module} imports {target}" for module, found in imports.items()
            for target, allowed in ENTRY_POINTS.items() if target in found and module not in allowed]


@pytest.mark.parametrize("argv, text", [(["--version"], "rlparity "), (["--help"], "Usage"), ([], "Usage")])
def test_version_and_help_create_nothing_in_the_working_directory(tmp_path, argv, text):
    res = _python(["-m", "rlparity", *argv], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert text in res.stdout
    assert sorted(os.listdir(tmp_path)) == []  # no runs/, no runs/logs, no log file


def test_a_command_without_an_engine_sets_up_no_engine_logging(tmp_path):
    code = ("import os\nfrom rlparity.cli import main\ncode = main(['findings', '--json'])\n"
            "print('exit', code, os.environ.get('VLLM_CONFIGURE_LOGGING'), os.environ.get('VLLM_LOGGING_STREAM'))")
    env_before = {k: os.environ.get(k) for k in ("VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_STREAM")}
    if any(env_before.values()):
        pytest.skip(f"the test process already sets {env_before}")
    res = _python(["-c", code], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "exit 0 None None"
    assert os.listdir(tmp_path) == []


def test_no_cli_module_imports_the_entry_point_or_the_root_app():
    imports = cli_imports()
    assert len(imports) >= 12 and "rlparity.cli.app" in imports
    assert entry_point_violations(imports) == []


def test_the_entry_point_check_sees_a_command_importing_main(tmp_path):
    """The check can fail: a command module planted with ``from rlparity.cli.main import ...``."""
    (tmp_path / "planted.py").write_text("from rlparity.cli.main import BadInput\n")
    (tmp_path / "other.py").write_text("def f():\n    from rlparity.cli import app\n")
    assert entry_point_violations(cli_imports(tmp_path)) == ["rlparity.cli.other imports rlparity.cli.app",
                                                              "rlparity.cli.planted imports rlparity.cli.main"]


def test_importing_the_cli_registers_nothing(tmp_path):
    """Importing ``rlparity.cli`` imports no command module; importing every command module builds no app
    (no module-level ``typer.Typer``); the root app is built by a function, the same each call."""
    code = ("import sys\nimport rlparity.cli\n"
            "print(sorted(m for m in sys.modules if m.startswith('rlparity.cli')))")
    res = _python(["-c", code], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "['rlparity.cli', 'rlparity.cli.app', 'rlparity.cli.contract', 'rlparity.cli.main']"

    import importlib

    for path in sorted(CLI.glob("*.py")):
        if path.stem in ("__main__", "__init__"):
            continue
        module = importlib.import_module(f"rlparity.cli.{path.stem}")
        apps = [name for name, value in vars(module).items() if isinstance(value, typer.Typer)]
        assert apps == [], f"{module.__name__} builds {apps} at import"

    from rlparity.cli import build_app

    first, second = typer.main.get_command(build_app()), typer.main.get_command(build_app())
    ctx = first.make_context("rlparity", [], resilient_parsing=True)
    names = list(first.list_commands(ctx))
    assert names == list(second.list_commands(ctx))
    assert names[:5] == ["make-model", "capture", "score", "summary", "run"]
    assert {"faults", "layers", "experiment", "book", "verify-weights", "floor"} <= set(names)
    experiment = first.get_command(ctx, "experiment")
    assert sorted(experiment.list_commands(ctx)) == ["ablation", "faults", "floors", "inflight", "moe", "objective", "rl"]


def _parse(root, args: list[str]):
    """Parse ``rlparity ARGS`` down to its command without running it: (command path, params)."""
    ctx = root.make_context("rlparity", list(args))
    command, path = root, []
    while hasattr(command, "get_command"):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        path.append(rest[0])
        command = command.get_command(ctx, rest[0])
        assert command is not None, f"no command {path}"
        ctx = command.make_context(rest[0], rest[1:], parent=ctx)
    return path, ctx.params


def test_gpu_run_command_lines_parse():
    """Every part of scripts/gpu_run.py that runs the CLI names a command and options that exist."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_run
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from rlparity.cli import build_app

    root = typer.main.get_command(build_app())
    parsed = {}
    for name, (command, _limit) in gpu_run.PARTS.items():
        argv = shlex.split(command.format(out="/tmp/out", card="h200").split("&&")[0])
        if argv[1:3] == ["-m", "rlparity"]:
            parsed[name] = _parse(root, argv[3:])
    assert set(parsed) == {"ablation", "ablation_queue", "faults", "faults_kv", "floors", "floors_1p5b", "objective"}
    path, params = parsed["ablation_queue"]  # the example named after the card that ran it
    assert set(params["knobs"].split(",")) == {"max_num_seqs", "chunked_prefill"}
    assert params["example"] == "h200-ablation-queue" and parsed["objective"][1]["example"] == "h200-objective"
    path, params = parsed["ablation"]
    assert path == ["experiment", "ablation"] and params["budget_s"] == 430 and params["example"] == "h100-ablation"
    assert {"async_scheduling", "cascade_attention", "attention_backend", "batch_invariant"} <= set(
        params["knobs"].split(","))
    path, params = parsed["faults"]
    assert path == ["experiment", "faults"]
    assert (params["size"], params["dtype"], params["sigma"], params["inflight_tokens"], params["update_after"],
            params["example"]) == ("small", "bfloat16", 0.2, 128, 0.1, "h200-faults")
    path, params = parsed["floors_1p5b"]
    assert path == ["experiment", "floors"]
    assert (params["shape"], params["gpu_memory_utilization"], params["n_prompts"]) == ("1.5b", 0.6, 64)
    with pytest.raises(typer.TyperException):  # an option that does not exist fails the parse
        _parse(root, ["experiment", "faults", "--out", "x", "--no-such-flag"])


def test_experiment_progress_goes_to_the_log_file_not_the_page(tmp_path, monkeypatch, capsys):
    """Issue 28: the runners' progress lines ("engine started in 28.3 s", one per arm) made 14 boxes
    on notebook 04's page. Their default ``log`` appends them to the log file the notebook chose;
    without a chosen file they go to stderr (which pages drop), never stdout."""
    from rlparity.config import logs
    from rlparity.experiments.inflight import inflight_matrix

    assert inspect.signature(inflight_matrix).parameters["log"].default is logs.progress_log
    monkeypatch.setattr(logs, "_CHOICE", {"file": None})
    logs.progress_log("no file chosen")
    out = capsys.readouterr()
    assert out.out == "" and out.err == "no file chosen\n"
    monkeypatch.setattr(logs, "_CHOICE", {"file": tmp_path / "logs" / "vllm-x.log"})
    logs.progress_log("engine started in 1.0 s")
    logs.progress_log("  arm-a: pause 0.06 s")
    assert capsys.readouterr() == ("", "")
    lines = (tmp_path / "logs" / "vllm-x.log").read_text().splitlines()
    assert [ln.split(" INFO rlparity: ")[1] for ln in lines] == ["engine started in 1.0 s", "  arm-a: pause 0.06 s"]
