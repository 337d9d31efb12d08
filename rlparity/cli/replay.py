"""``rlparity replay SOURCE`` (a trace's own tokens through a real engine, the engine's logprob of
exactly those tokens) and ``rlparity bisect SOURCE`` (those tokens replayed under the capture's
settings twice, then one knob at a time, each knob's shift in units of the replay floor)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from rlparity.cli.common import check_model, comma_list, echo_json
from rlparity.cli.contract import EXIT_OK, BadInput, engine_logs


def _source(source: Path, arm: str | None, step: int | None):
    """The source arm: an arm of a trace store, or a step of a run store (as a trace)."""
    from rlparity.record import run_record
    from rlparity.record.store import is_run_store, open_run, step_trace
    from rlparity.trace import load, open_arms

    if not source.exists():
        raise BadInput(f"{source}: no such store (give a trace store, or a run store with --step)")
    if is_run_store(source):
        run = open_run(source, chunks=1)
        steps = int(run_record(run).steps)
        n = steps - 1 if step is None else step
        if not 0 <= n < steps:
            raise BadInput(f"--step {step}: {source} holds steps 0..{steps - 1}")
        return step_trace(run, n).assign_attrs(arm=f"step_{n:06d}")
    if step is not None:
        raise BadInput(f"--step {step}: {source} is a trace store, not a run store; pick an arm with --arm")
    arms = open_arms(source)
    if arm is None:
        if len(arms) != 1:
            raise BadInput(f"{source} holds {len(arms)} arms ({', '.join(sorted(arms))}): pick one with --arm")
        arm = next(iter(arms))
    if arm not in arms:
        raise BadInput(f"no arm {arm!r} in {source}; it holds {sorted(arms)}")
    return load(source, arm=arm).assign_attrs(arm=arm)


def _model_and_settings(trace, model: str | None, engine: str | None, profile: str | None):
    from rlparity.capture.replay import capture_settings
    from rlparity.cli.common import engine_settings, model_path
    from rlparity.trace import arm_record

    path = model or arm_record(trace).model
    if not path:
        raise BadInput("the trace records no model: give it with --model")
    from rlparity.models import SIZES

    if model is None and str(path) not in SIZES and not Path(str(path)).is_dir():
        raise BadInput(f"the trace's model {path!r} is no local checkpoint here: give the model with --model")
    settings = engine_settings(engine, profile) if (engine or profile) else capture_settings(trace)
    if settings is None:
        given = arm_record(trace).given.to_attrs()
        said = (f"; its run records only the engine settings the loop named ({', '.join(f'{k}={v}' for k, v in given.items())}), "
                "not a capture's full settings") if given else ""
        raise BadInput(f"the trace records no engine settings (an import or a run's step){said}: give them with "
                       "--engine JSON or --profile NAME")
    return model_path(str(path)), settings


def _prepare(source: Path, arm: str | None, step: int | None, model: str | None, engine: str | None,
             profile: str | None, out: Path | None, mode: str, modes: tuple[str, ...]):
    """Every check before an engine starts: the mode, the output, the source arm, the model, the
    settings and the replay paths this vLLM has; then the engines' logging (before vLLM resolves a
    configuration, so stdout stays the command's)."""
    if mode not in modes:
        raise BadInput(f"--mode {mode!r}: use {', '.join(modes)}")
    if out is not None:
        from rlparity.cli.common import output_store

        output_store(out)
    trace = _source(source, arm, step)
    path, settings = _model_and_settings(trace, model, engine, profile)
    from rlparity.capture.replay import logprobs_mode, replay_modes

    engine_logs()
    try:
        logprobs_mode(trace, settings)
        return trace, path, settings, replay_modes(path, settings, mode)
    except ValueError as err:
        raise BadInput(str(err)) from None


def _save(out: Path, arms: dict[str, Any], source) -> None:
    from rlparity.trace import add_arm, arm_record

    src = arm_record(source).arm or "source"
    add_arm(source, out, src)
    for name, ds in arms.items():
        add_arm(ds, out, name)


def _fmt(x: Any) -> str:
    return "n/a" if x is None or x != x else f"{x:.3g}"


def replay_cmd(
    source: Path = typer.Argument(..., help="a trace store (pick the arm with --arm) or a run store (--step)"),
    arm: Optional[str] = typer.Option(None, help="the arm whose tokens are replayed (default: the store's only arm)"),
    step: Optional[int] = typer.Option(None, min=0, help="a run store's step (default: the last)"),
    model: Optional[str] = typer.Option(None, help="the model (default: the trace's attrs['model'])",
                                        callback=check_model),
    engine: Optional[str] = typer.Option(None, help="engine settings as JSON (default: the capture's own, from "
                                                    "the trace)"),
    profile: Optional[str] = typer.Option(None, help="engine profile (name or YAML) instead of the capture's"),
    mode: str = typer.Option("both", help="decode (SamplingParams.trace_decode_token_ids), prefill (prompt_logprobs) "
                                          "or both (every path this engine has); auto: decode where it exists"),
    warm: bool = typer.Option(False, help="replay against a warm prefix cache (the prompts prefilled first)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="store to write the source and replayed arms to"),
    as_json: bool = typer.Option(False, "--json", help="print strict JSON"),
):
    """Replay a trace's own tokens through a real engine under named settings (the capture's own by
    default) and print how far the engine's logprobs of exactly those tokens sit from the captured
    ones, per replay path. The replayed arms keep the source's trainer numbers."""
    trace, path, settings, (modes, why_not) = _prepare(source, arm, step, model, engine, profile, out, mode,
                                                       ("auto", "both", "prefill", "decode"))
    from rlparity.capture.replay import replay, replay_engine_settings
    from rlparity.metrics.replay import capture_gap
    from rlparity.trace import arm_record

    from rlparity.capture import Engine

    both = "both" if len(modes) > 1 else modes[0]
    arms = {}
    with Engine(path, replay_engine_settings(settings, trace, both)) as eng:
        for m in modes:
            try:
                ds = replay(eng, trace, mode=m, warm=warm)
            except ValueError as err:
                raise BadInput(str(err)) from None
            arms[arm_record(ds).name] = ds
    rows = {name: {"mode": arm_record(ds).replay["mode"], **capture_gap(ds, trace)} for name, ds in arms.items()}
    if out is not None:
        _save(out, arms, trace)
    if as_json:
        echo_json({"arms": rows, "modes_not_run": why_not})
    else:
        for name, r in rows.items():
            typer.echo(f"{name} ({r['mode']} replay): |replay - capture| mean {_fmt(r['mean_abs'])}, max "
                       f"{_fmt(r['max_abs'])} nats over {r['n_tokens']} tokens")
        for m, why in why_not.items():
            typer.echo(f"{m} replay not run: {why}", err=True)
        if out is not None:
            typer.echo(f"wrote {', '.join(arms)} to {out}", err=True)
    raise typer.Exit(EXIT_OK)


def bisect_cmd(
    source: Path = typer.Argument(..., help="a trace store (pick the arm with --arm) or a run store (--step)"),
    arm: Optional[str] = typer.Option(None, help="the arm whose tokens are replayed (default: the store's only arm)"),
    step: Optional[int] = typer.Option(None, min=0, help="a run store's step (default: the last)"),
    model: Optional[str] = typer.Option(None, help="the model (default: the trace's attrs['model'])",
                                        callback=check_model),
    engine: Optional[str] = typer.Option(None, help="the capture's engine settings as JSON (default: recorded in "
                                                    "the trace)"),
    profile: Optional[str] = typer.Option(None, help="engine profile (name or YAML) instead of the recorded settings"),
    knobs: Optional[str] = typer.Option(None, help="comma list of knobs, in the order their engines start "
                                                   "(default: all)"),
    budget: Optional[int] = typer.Option(None, min=1, help="most engine starts, the baseline's included (the knobs "
                                                           "past it are listed as skipped)"),
    mode: str = typer.Option("auto", help="replay path: auto (decode where the engine has it), prefill or decode"),
    top: Optional[int] = typer.Option(None, min=0, help="tokens named per knob (default: "
                                                        "defaults().replay_top_tokens)"),
    pairs: str = typer.Option("auto", help="pairs of knobs: auto (where no single knob closes "
                                           "defaults().bisect_explained_share of the gap against the trainer; needs a "
                                           "scored trace), always or never"),
    share: Optional[float] = typer.Option(None, min=0.0, max=1.0, help="share of the gap one knob must close "
                                          "(default: defaults().bisect_explained_share)"),
    layers: bool = typer.Option(False, "--layers", help="hand the winner's worst tokens to the per-layer "
                                                        "localisation (two eager engine starts, in the budget)"),
    layer_tokens: Optional[int] = typer.Option(None, min=1, help="worst tokens handed to the layers (default: "
                                                                 "defaults().replay_layers_tokens)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="store to write the replayed arms to"),
    as_json: bool = typer.Option(False, "--json", help="print strict JSON"),
):
    """Replay a trace's tokens under the capture's own settings twice (the replay floor), then flip
    one engine knob at a time, and rank the knobs by how far each moves the user's tokens, in units
    of that floor, with the tokens each moves most; pairs of knobs where no single one closes the gap
    against the trainer; with --layers, where the winner's worst tokens part, layer by layer."""
    from rlparity.experiments.bisect import KNOBS, PAIRS, BisectOptions, bisect, report

    chosen = comma_list(knobs, "--knobs", list(KNOBS)) or list(KNOBS)
    if pairs not in PAIRS:
        raise BadInput(f"--pairs {pairs!r}: use {', '.join(PAIRS)}")
    options = BisectOptions(knobs=chosen, budget=budget, mode=mode, pairs=pairs, share=share, layers=layers,
                            layer_tokens=layer_tokens)
    trace, path, settings, _ = _prepare(source, arm, step, model, engine, profile, out, mode,
                                        ("auto", "prefill", "decode"))
    try:
        arms, record = bisect(path, trace, options, settings=settings, log=lambda m: typer.echo(m, err=True))
    except ValueError as err:
        raise BadInput(str(err)) from None
    from transformers import AutoTokenizer

    rep = report(arms, trace, record, tokenizer=AutoTokenizer.from_pretrained(path), top=top)
    if out is not None:
        _save(out, arms, trace)
    if as_json:
        echo_json(rep)
        raise typer.Exit(EXIT_OK)
    _print_bisect(rep, budget)
    if out is not None:
        typer.echo(f"wrote {len(arms)} replayed arms to {out}", err=True)
    raise typer.Exit(EXIT_OK)


def _print_bisect(rep: dict[str, Any], budget: int | None) -> None:
    """The bisection's report as lines: the replay against the capture and the floor, the ranked
    knobs with their top tokens, what did not run, the trainer gap, the pairs, the layers, the starts."""
    cap, fl = rep["replay_vs_capture"], rep["floor"]
    typer.echo(f"{rep['mode']} replay under the capture's settings: |replay - capture| mean {_fmt(cap['mean_abs'])}, "
               f"max {_fmt(cap['max_abs'])} nats; replay floor (same settings twice) mean {_fmt(fl['mean_abs'])}, "
               f"max {_fmt(fl['max_abs'])} nats over {fl['n_tokens']} tokens")
    typer.echo(f"{'rank':<5}{'knob':<34}{'x floor':>10}{'closes':>8}{'mean |d|':>11}{'moved':>8}"
               f"{'|replay-capture|':>18}  top tokens")
    for r in rep["knobs"]:
        tops = ", ".join(f"s{t['sequence']}p{t['position']} {t.get('token_text', t['token_id'])!r} {t['delta']:+.3g}"
                         for t in r["top_tokens"][:3])
        typer.echo(f"{r['rank']:<5}{r['knob']:<34}{_fmt(r['floor_units']):>10}{_fmt(r.get('explained')):>8}"
                   f"{_fmt(r['mean_abs']):>11}{r['share_moved']:>8.1%}{_fmt(r.get('capture_mean_abs')):>18}  {tops}")
    for p in rep["not_run"]:
        typer.echo(f"{p['status']}: {p['knob']}: {p['reason']}")
    if rep["trainer_gap"]["verdict"]:
        typer.echo(f"against the trainer: capture {_fmt(rep['trainer_gap']['capture'])}, replay "
                   f"{_fmt(rep['trainer_gap']['baseline'])} nats; {rep['trainer_gap']['verdict']}")
    typer.echo(f"pairs: {rep['pairs']['why']}")
    lay = rep["layers"] or {}
    typer.echo(f"layers: {lay.get('sentence') or lay.get('reason') or lay.get('status')}")
    typer.echo(f"{rep['engine_start_attempts']} engine start(s) tried, {rep['engine_starts']} started"
               + (f" (budget {budget})" if budget else "") + f", {rep['wall_s']:.1f} s")


__all__ = ["bisect_cmd", "replay_cmd"]
