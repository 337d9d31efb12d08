"""The watermark at the end of every notebook: device, vLLM, torch, transformers, date and model of
this run and of each shipped example the page shows."""

from __future__ import annotations

import datetime as dt
import platform
from importlib import metadata

import pytest

from rlparity.config.provenance import Watermark, device_name, run_provenance, short_model
from rlparity.datasets import example_provenance, list_examples, watermark


def test_this_run_row_names_the_installed_versions_and_the_cpu():
    row = run_provenance("/some/cache/models/tiny", device="cpu")
    assert row["device"] == f"CPU ({platform.machine()})" == device_name("cpu")
    assert row["torch"] == metadata.version("torch") and row["transformers"] == metadata.version("transformers")
    assert row["date"] == dt.datetime.now(dt.timezone.utc).date().isoformat()
    assert row["model"] == "tiny"
    assert short_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B" and short_model(None) is None


def test_example_rows_come_from_the_examples_own_provenance():
    info = list_examples()["h200-semantic"]
    row = example_provenance("h200-semantic")
    assert (row["device"], row["vllm"], row["torch"], row["date"], row["model"]) == (
        info["device_name"], info["vllm"], info["torch"], info["date"], info["model"])
    floors = example_provenance("h200-floors-small")  # a JSON result: its own "example" record
    assert (floors["model"], floors["vllm"], floors["device"]) == ("small", "0.26.0", "NVIDIA H200")
    assert floors["transformers"] is None  # not recorded by that run
    with pytest.raises(ValueError, match="no shipped result"):
        example_provenance("no-such-example")


def test_the_table_has_one_row_per_source_and_says_what_is_not_recorded():
    w = watermark("tiny", device="cpu", examples=["h200-semantic", "h200-floors-small"])
    assert isinstance(w, Watermark) and [r["source"] for r in w.rows] == [
        "this run", "example h200-semantic", "example h200-floors-small"]
    html = w._repr_html_()
    assert html.count("<tr>") == 4 and "<th>vLLM</th>" in html and "NVIDIA H200" in html
    text = str(w).splitlines()
    assert len(text) == 4 and text[0].split()[:3] == ["source", "device", "vLLM"]
    assert "not recorded" in text[3]


def test_every_notebook_ends_with_a_watermark():
    import jupytext

    from rlparity.cli.notebooks import notebook_paths

    for path in notebook_paths():
        nb = jupytext.read(path.with_suffix(".py"))
        last = [c for c in nb.cells if c.cell_type == "code"][-1]
        assert "watermark(model, device=device" in last.source, path.name
