"""Inference-path commands: ``profiles``, ``audit``, ``ablate``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlparity.cli.common import check_model, comma_list, echo_json, model_path, output_store, sampling_settings
from rlparity.cli.contract import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_OK, engine_logs, option_defaults

_D = option_defaults()


def profiles_cmd(name: Optional[str] = typer.Argument(None, help="show this profile's settings")):
    """List the built-in engine profiles, or print one as YAML."""
    import yaml

    from rlparity.config.profiles import profile_names, read_profile

    if name is None:
        for n in profile_names():
            typer.echo(f"{n}: {read_profile(n)['description']}")
        return
    p = read_profile(name)
    typer.echo(yaml.safe_dump({"description": p["description"],
                               "settings": p["settings"].model_dump(exclude_none=True)}, sort_keys=False))


def audit_cmd(
    source: str = typer.Argument(..., help="a trace (zarr), a YAML/JSON file of vLLM engine kwargs, a vLLM "
                                          "command line in quotes, or 'start' to start an engine"),
    profile: str = typer.Option(_D.profile, help="profile to audit against (name or YAML)"),
    engine_profile: Optional[str] = typer.Option(
        None, "--engine-profile", help="with SOURCE=start: start a real engine with this profile and audit it"),
    model: str = typer.Option("tiny", help="with SOURCE=start: the model ('tiny' = built-in)", callback=check_model),
    as_json: bool = typer.Option(False, "--json", help="print strict JSON"),
):
    """List every effective setting that differs from a profile, with why it matters.

    Effective values come from the engine (a trace records what the running engine reported; a
    command line or kwargs are resolved by this vLLM without starting it). ``rlparity audit start
    --engine-profile vllm-v1-defaults`` starts a real engine on the tiny model. Exit 1 when
    something differs, 2 on bad input or when the source records none of the profile's settings.
    """
    engine_logs()
    from rlparity.capture.audit import audit

    if source == "start":
        from rlparity.capture import Engine
        from rlparity.config.profiles import load_profile

        with Engine(model_path(model), load_profile(engine_profile or "vllm-v1-defaults")) as eng:
            res = audit(eng, profile)
    else:
        res = audit(source, profile)
    if as_json:
        echo_json(res.to_dict())
    else:
        typer.echo(str(res))
    if res.nothing_checked:
        typer.echo(f"rlparity: error: nothing was audited: {source!r} records none of the settings profile "
                   f"{res.profile!r} fixes (capture with rlparity, or pass engine kwargs / a command line)", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    raise typer.Exit(EXIT_OK if res.ok else EXIT_FAIL)


def ablate_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="zarr store for every arm"),
    model: str = typer.Option("tiny", help="'tiny' (built-in) or a model path", callback=check_model),
    reference: str = typer.Option(_D.profile, help="reference profile (name or YAML)"),
    knob: Optional[list[str]] = typer.Option(None, help="knobs to change (default: all built-in)"),
    num_prompts: int = typer.Option(8, min=1),
    max_tokens: int = typer.Option(16, min=1),
    temperature: float = _D.temperature,
    top_k: int = _D.top_k,
    dtype: str = typer.Option("float32", help="body dtype pinned on both sides ('' = the profile's)"),
):
    """One-knob-at-a-time inference-path ablation from a reference profile, same prompts and
    seeds; every arm lands in one store; prints the table and the findings."""
    engine_logs()
    from rlparity.capture.pool import shared_pool
    from rlparity.diagnose.path import ablation_findings
    from rlparity.experiments.ablation import DEFAULT_KNOBS, KNOBS, ablation, shared_prefix_prompts
    from rlparity.metrics.ablation import ablation_table
    from rlparity.score import Scorer
    from rlparity.trace import save

    if knob:
        comma_list(",".join(knob), "--knob", list(KNOBS))
    output_store(out)
    path = model_path(model)
    prompts = shared_prefix_prompts(num_prompts)
    sampling = sampling_settings(temperature=temperature, top_k=top_k, max_tokens=max_tokens, seed=0)
    scorer = Scorer(path, dtype=dtype or "float32", head_dtype="float32", progress=False)
    try:
        arms = ablation(path, prompts, sampling, reference=reference, knobs=knob or DEFAULT_KNOBS,
                        engine={"dtype": dtype} if dtype else None, scorer=scorer)
    finally:
        shared_pool().close()
    save(arms, out)
    table = ablation_table(arms).to_dataframe()
    typer.echo(table.drop(columns=["reason"]).to_string())
    for f in ablation_findings(arms):
        typer.echo(str(f))
    typer.echo(f"wrote {len(arms)} arm(s) to {out}")
