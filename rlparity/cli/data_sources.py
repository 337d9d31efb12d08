"""Commands that bring data in: ``import`` (other frameworks' dumps), ``gallery`` (every diagnosis
captured on one device), ``examples`` (the shipped example data)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from rlparity.cli.common import comma_list, device_option, echo_json, output_folder
from rlparity.cli.contract import BadInput, engine_logs


class Reading(str, Enum):
    processed = "processed"
    raw = "raw"
    none = "none"


def import_cmd(
    format: str = typer.Argument(..., help="prime-rl, nemo-rl, slime, pipelinerl or generic (verl and custom loops)"),
    path: Path = typer.Argument(..., help="a dump file or a folder of them"),
    out: Path = typer.Option(..., "--out", "-o", help="zarr store to write (one arm per step, rank or file)"),
    temperature: Optional[float] = typer.Option(None, help="the sampling temperature your run used (recorded as "
                                                           "user-supplied; most dumps do not record it)"),
    top_k: Optional[int] = typer.Option(None, help="the run's top-k (0 = off)"),
    top_p: Optional[float] = typer.Option(None, help="the run's top-p (1 = off)"),
    trainer_reading: Optional[Reading] = typer.Option(None, help="where the framework's trainer logprobs go "
                                                                 "(default: decided per framework, see the docs)"),
    overwrite: bool = typer.Option(False, help="replace an existing rlparity store at --out"),
    progress: bool = typer.Option(True, help="show a progress bar"),
    as_run: bool = typer.Option(False, "--as-run", help="write a run store instead (prime-rl or verl: the run's "
                                                        "per-step dumps through the run recorder, its metrics and "
                                                        "alarms per step; then `rlparity doctor OUT`)"),
):
    """Import another framework's rollout dump into an rlparity store, streaming (files larger than
    memory are fine); a malformed line stops with its file and line number and nothing half-written
    remains. Then: `rlparity diagnose OUT` (or `rlparity score OUT --model MODEL` first for dumps
    with the rollout side only). With --as-run, a whole run's per-step dumps become one run store
    (what rlparity.record.Recorder writes) for `rlparity doctor OUT`."""
    import rlparity.importers as rio

    if as_run:
        from rlparity.experiments.run_import import FORMATS, import_run

        if format not in FORMATS:
            raise BadInput(f"--as-run reads {' or '.join(FORMATS)} runs, not {format!r}")
        if trainer_reading is not None:
            raise BadInput("--trainer-reading is not used with --as-run: the run store takes the importer's reading")
        typer.echo(str(import_run(format, path, out, temperature=temperature, top_k=top_k, top_p=top_p,
                                  overwrite=overwrite)))
        return
    if format not in rio.formats() and format != "verl":
        raise BadInput(f"unknown format {format!r}; choose one of {', '.join(rio.formats())}")
    res = rio.import_to_store(format, path, out, temperature=temperature, top_k=top_k, top_p=top_p,
                              trainer_reading=trainer_reading.value if trainer_reading else None,
                              progress=progress, overwrite=overwrite)
    typer.echo(str(res))


def gallery_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="folder for the stores and gallery.json"),
    device: str = device_option("cuda", help="cuda (the GPU gallery) or cpu"),
    size: str = typer.Option("small", help="built-in model: small (GPU), tiny or tiny-bf16 (CPU)"),
    n_prompts: int = typer.Option(128, min=1),
    n_head_prompts: int = typer.Option(256, min=1),
    max_tokens: int = typer.Option(32, min=1),
    parts: str = typer.Option("semantic,head,fresh,ablation", help="comma-separated parts to run"),
    ablation_prompts: int = typer.Option(8, min=1, help="prompts of the ablation part"),
    ablation_knobs: str = typer.Option("", help="comma-separated knobs of the ablation (default: the built-in "
                                                "ones)"),
    fresh_size: Optional[str] = typer.Option(None, help="another built-in model for the fresh capture (default: "
                                                         "--size)"),
):
    """Capture every diagnosis of the method on one device (semantic arms with a temperature sweep,
    the LM-head matrix, a fresh capture, the inference-path ablation) and write compact stores
    (what rlparity ships as example data) and gallery.json with every verdict."""
    from rlparity.experiments.ablation import KNOBS
    from rlparity.experiments.gallery import PARTS, gallery

    chosen = comma_list(parts, "--parts", list(PARTS))
    knobs = comma_list(ablation_knobs, "--ablation-knobs", list(KNOBS)) if ablation_knobs else None
    prefix = "h200" if device.startswith("cuda") else "cpu"
    output_folder(out, *(f"{prefix}-{p}.zarr" for p in chosen if p != "fresh"))
    engine_logs()
    res = gallery(out, device=device, size=size, n_prompts=n_prompts, n_head_prompts=n_head_prompts,
                  max_tokens=max_tokens, parts=chosen, ablation_prompts=ablation_prompts, ablation_knobs=knobs,
                  progress=False, fresh_size=fresh_size)
    errors = {k: v.splitlines()[-1] for k, v in res.items() if k.startswith("error")}
    for part in ("semantic", "head", "fresh"):
        for arm, v in (res.get(part) or {}).items():
            typer.echo(f"{part}/{arm}: {v['semantic']} ({v['semantic_severity']}), alpha "
                       f"{v['alpha_processed']}, check {'pass' if v['check_passed'] else 'FAIL ' + ','.join(v['check_failed'])}")
    typer.echo(f"wrote {out}/gallery.json in {res['seconds']} s")
    if errors:
        raise RuntimeError(f"gallery parts failed: {errors}")


def examples_cmd(name: Optional[str] = typer.Argument(None, help="show this example's arms"),
                 as_json: bool = typer.Option(False, "--json", help="print strict JSON")):
    """List the example data shipped with rlparity (H200 and CPU captures) with their provenance."""
    from rlparity.datasets import list_examples, load_example

    if name is None:
        info = list_examples()
        if as_json:
            echo_json(info)
            return
        for n, p in info.items():
            typer.echo(f"{n}: {p.get('description', '')} [{p.get('device_name', p.get('device'))}, vLLM "
                       f"{p.get('vllm')}, {p.get('date')}]")
        return
    arms = load_example(name)
    for arm, ds in arms.items():
        typer.echo(f"{arm}: {ds.sizes['sequence']} sequences, {int(ds['response_mask'].sum())} tokens")
