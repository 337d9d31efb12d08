"""Inference-path commands: ``rlparity profiles``, ``rlparity audit``, ``rlparity ablate``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("profiles")
    def profiles_cmd(name: Optional[str] = typer.Argument(None, help="show this profile's settings")):
        """List the built-in engine profiles, or print one as YAML."""
        import yaml

        from rlparity.capture.profiles import profile_names, read_profile

        if name is None:
            for n in profile_names():
                typer.echo(f"{n}: {read_profile(n)['description']}")
            return
        try:
            p = read_profile(name)
        except (ValueError, FileNotFoundError) as err:
            typer.echo(str(err), err=True)
            raise typer.Exit(2) from err
        typer.echo(yaml.safe_dump({"description": p["description"],
                                   "settings": p["settings"].model_dump(exclude_none=True)}, sort_keys=False))

    @app.command("audit")
    def audit_cmd(
        source: str = typer.Argument(..., help="a trace (zarr), a YAML/JSON file of vLLM engine kwargs, "
                                              "a vLLM command line in quotes, or --model to start an engine"),
        profile: str = typer.Option("pipelinerl-parity", help="profile to audit against (name or YAML)"),
        engine_profile: Optional[str] = typer.Option(
            None, "--engine-profile", help="with SOURCE=start: start a real engine with this profile and audit it"),
        as_json: bool = typer.Option(False, "--json"),
    ):
        """List every effective setting that differs from a profile, with why it matters.

        Effective values come from the engine (a trace records what the running engine
        reported; a command line or kwargs are resolved by this vLLM without starting it).
        ``rlparity audit start --engine-profile vllm-v1-defaults`` starts a real engine on the
        tiny model. Exit 1 when something differs, 2 on bad input.
        """
        from rlparity.capture.audit import audit, audit_json

        try:
            if source == "start":
                from rlparity.capture import Engine
                from rlparity.capture.profiles import load_profile
                from rlparity.models import make_model

                with Engine(make_model("tiny", progress=False), load_profile(engine_profile or "vllm-v1-defaults")) as eng:
                    res = audit(eng, profile)
            else:
                res = audit(source, profile)
        except (ValueError, TypeError, FileNotFoundError) as err:
            typer.echo(f"cannot audit {source!r}: {err}", err=True)
            raise typer.Exit(2) from err
        typer.echo(audit_json(res) if as_json else str(res))
        raise typer.Exit(0 if res.ok else 1)

    @app.command("ablate")
    def ablate_cmd(
        out: Path = typer.Option(..., "--out", "-o", help="zarr store for every arm"),
        model: str = typer.Option("tiny", help="'tiny' (built-in) or a model path"),
        reference: str = typer.Option("pipelinerl-parity", help="reference profile (name or YAML)"),
        knob: Optional[list[str]] = typer.Option(None, help="knobs to change (default: all built-in)"),
        num_prompts: int = 8,
        max_tokens: int = 16,
        temperature: float = 0.7,
        top_k: int = 20,
        dtype: str = typer.Option("float32", help="body dtype pinned on both sides ('' = the profile's)"),
    ):
        """One-knob-at-a-time inference-path ablation from a reference profile, same prompts and
        seeds; every arm lands in one store; prints the table and the findings."""
        from rlparity.capture import SamplingSettings
        from rlparity.capture.pool import shared_pool
        from rlparity.diagnose.path import ablation_findings
        from rlparity.experiments.ablation import DEFAULT_KNOBS, ablation, ablation_table, shared_prefix_prompts
        from rlparity.models import make_model
        from rlparity.score import Scorer
        from rlparity.trace import save

        path = str(make_model("tiny", progress=False)) if model == "tiny" else model
        prompts = shared_prefix_prompts(num_prompts)
        sampling = SamplingSettings(temperature=temperature, top_k=top_k, max_tokens=max_tokens, seed=0)
        scorer = Scorer(path, dtype=dtype or "float32", head_dtype="float32", progress=False)
        try:
            arms = ablation(path, prompts, sampling, reference=reference, knobs=knob or DEFAULT_KNOBS,
                            engine={"dtype": dtype} if dtype else None, scorer=scorer)
        except ValueError as err:
            typer.echo(str(err), err=True)
            raise typer.Exit(2) from err
        finally:
            shared_pool().close()
        save(arms, out)
        table = ablation_table(arms).to_dataframe()
        typer.echo(table.drop(columns=["reason"]).to_string())
        for f in ablation_findings(arms):
            typer.echo(str(f))
        typer.echo(f"wrote {len(arms)} arm(s) to {out}")
