"""Inference-path commands: ``profiles``, ``audit`` (the ablation is ``rlparity experiment ablation``)."""

from __future__ import annotations

from typing import Optional

import typer

from rlparity.cli.common import check_model, echo_json, model_path
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

        settings = load_profile(engine_profile or "vllm-v1-defaults")  # a bad profile: refused before a model is built
        with Engine(model_path(model), settings) as eng:
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


