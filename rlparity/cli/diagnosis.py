"""Commands that judge traces: ``diagnose`` (findings with verdicts), ``check`` (the CI gate) and
``findings`` (the catalogue of finding codes)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from rlparity.cli.common import (
    block_progress,
    check_model,
    echo_json,
    engine_settings,
    model_path,
    output_store,
    sampling_settings,
    select_arms,
)
from rlparity.cli.contract import EXIT_FAIL, EXIT_OK, BadInput, engine_logs, option_defaults

_D = option_defaults()


class FailOn(str, Enum):
    error = "error"
    warning = "warning"


def diagnose_cmd(
    trace: Path = typer.Argument(..., help="zarr store written by rlparity (one or more arms)"),
    arm: Optional[list[str]] = typer.Option(None, help="only these arms (default: all)"),
    reference: Optional[str] = typer.Option(None, help="arm the others are compared with (inference path)"),
    tol: float = typer.Option(_D.tol, help="RMS of d (nats) under which two sides count as matched"),
    tol_reference: float = typer.Option(_D.tol_reference, help="max |d_ref| (nats) above which a setting "
                                                               "changes the numerics against the reference arm"),
    tol_trainer: float = typer.Option(_D.tol_trainer, help="change of mean |d| vs the trainer (nats) above which "
                                                           "a setting moves the parity gap"),
    profile: str = typer.Option(_D.profile, help="engine profile the path settings are audited against"),
    as_json: bool = typer.Option(False, "--json", help="print the report as strict JSON"),
    fail_on: FailOn = typer.Option(FailOn.error, help="lowest severity that makes the exit code 1"),
    chunks: Optional[int] = typer.Option(None, min=1, help="read the store lazily, this many sequences at a "
                                                          "time (traces larger than memory; needs dask)"),
):
    """Diagnose every arm (semantic, inference path, LM head). Exit 1 if a finding at
    ``--fail-on`` severity or worse is present, 2 on bad input. With --chunks the store is read
    block by block (each block validated and CRC-checked); an arm of more than 2M real tokens is
    judged on a systematic sample of its sequences (the report's context says which)."""
    from rlparity.diagnose import Severity, diagnose
    from rlparity.trace import open_arms

    arms = select_arms(open_arms(trace, chunks=chunks), arm, trace)
    report = diagnose(arms, title=f"rlparity diagnose {trace}", reference=reference, tol=tol,
                      tol_reference=tol_reference, tol_trainer=tol_trainer, profile=profile,
                      progress=block_progress())
    if as_json:
        echo_json(report.to_dict())
    else:
        typer.echo(str(report))
    raise typer.Exit(EXIT_FAIL if report.problems(Severity(fail_on.value)) else EXIT_OK)


def check_cmd(
    trace: Optional[Path] = typer.Argument(None, help="scored zarr store; omit to capture with --model"),
    thresholds: Optional[Path] = typer.Option(None, help="thresholds YAML (default: the shipped defaults, "
                                                         "rlparity/data/check.yaml)"),
    model: Optional[str] = typer.Option(None, help="capture first: model path or hub id ('tiny' = built-in)",
                                        callback=check_model),
    engine: Optional[str] = typer.Option(None, help="engine settings as JSON (with --model)"),
    profile: Optional[str] = typer.Option(None, help="named or YAML engine profile (with --model)"),
    num_prompts: int = typer.Option(16, min=1),
    max_tokens: int = _D.max_tokens,
    temperature: float = _D.temperature,
    top_k: int = _D.top_k,
    out: Optional[Path] = typer.Option(None, help="where to keep the captured trace (with --model)"),
    as_json: bool = typer.Option(False, "--json", help="print strict JSON"),
):
    """Fail (exit 1) when rollout and trainer logprobs are not at parity; 0 when they are."""
    from rlparity.diagnose.check import check, load_thresholds

    th = load_thresholds(thresholds)
    if out is not None:
        output_store(out)
    if (trace is None) == (model is None):
        raise BadInput("give either a TRACE store or --model to capture one")
    data: Any = trace if trace is not None else _capture(model, engine, profile, num_prompts, max_tokens,
                                                         temperature, top_k, out)
    result = check(data, th)
    if as_json:
        echo_json(result.to_dict())
    else:
        typer.echo(str(result))
    raise typer.Exit(EXIT_OK if result.passed else EXIT_FAIL)


def findings_cmd(
    code: Optional[str] = typer.Argument(None, help="one finding code (default: list every code)"),
    as_json: bool = typer.Option(False, "--json", help="print strict JSON"),
):
    """The catalogue of finding codes: every code with its layer, severities and meaning; with a CODE,
    its rule, thresholds (current values, what they were calibrated on) and fix. Exit 2 for an
    unknown code."""
    from rlparity.diagnose.catalogue import catalogue, catalogue_text, lookup

    try:
        entries = [lookup(code)] if code is not None else list(catalogue().values())
    except KeyError as err:
        raise BadInput(err.args[0]) from None
    if as_json:
        echo_json([e.to_dict() for e in entries] if code is None else entries[0].to_dict())
    else:
        typer.echo(catalogue_text(code))
    raise typer.Exit(EXIT_OK)


def _capture(model, engine_json, profile, num_prompts, max_tokens, temperature, top_k, out):
    engine_logs()
    from rlparity.capture import Engine
    from rlparity.models import make_prompts
    from rlparity.score import score
    from rlparity.trace import add_arm

    # the settings first: a bad --engine / --profile is refused before a built-in model is built
    settings = engine_settings(engine_json, profile)
    sampling = sampling_settings(temperature=temperature, top_k=top_k, max_tokens=max_tokens)
    model = model_path(model)
    with Engine(model, settings) as eng:
        trace = eng.capture(make_prompts(num_prompts), sampling, arm="check", progress=False)
    if out is not None:
        add_arm(trace, out, "check")  # keep the rollout even if rescoring fails
    trace = score(trace, model, progress=False)
    if out is not None:
        add_arm(trace, out, "check")
    return {"check": trace}
