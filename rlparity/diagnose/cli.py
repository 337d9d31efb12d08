"""``rlparity diagnose``: print the findings of a store; the exit code says whether any is an error."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose_cmd(
        trace: Path = typer.Argument(..., help="zarr store written by rlparity (one or more arms)"),
        arm: Optional[list[str]] = typer.Option(None, help="only these arms (default: all)"),
        reference: Optional[str] = typer.Option(None, help="arm the others are compared with"),
        tol: float = typer.Option(0.02, help="RMS of d (nats) under which two sides count as matched"),
        as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
        fail_on: str = typer.Option("error", help="lowest severity that makes the exit code 1: error or warning"),
    ):
        """Diagnose every arm (semantic, inference path, LM head). Exit 1 if a finding at
        ``--fail-on`` severity or worse is present, 2 if the store cannot be read."""
        from rlparity.diagnose import Severity, diagnose
        from rlparity.trace import TraceValidationError, open_arms

        if fail_on not in ("error", "warning"):
            raise typer.BadParameter("--fail-on must be 'error' or 'warning'")
        try:
            arms = open_arms(trace)
        except (FileNotFoundError, KeyError, ValueError, TraceValidationError) as err:
            typer.echo(f"cannot read {trace}: {err}", err=True)
            raise typer.Exit(2) from err
        if arm:
            unknown = sorted(set(arm) - set(arms))
            if unknown:
                typer.echo(f"no arm(s) {unknown} in {trace}; it has {sorted(arms)}", err=True)
                raise typer.Exit(2)
            arms = {k: v for k, v in arms.items() if k in arm}
        try:
            report = diagnose(arms, reference=reference, title=f"rlparity diagnose {trace}", tol=tol)
        except TraceValidationError as err:
            typer.echo(str(err), err=True)
            raise typer.Exit(2) from err
        typer.echo(report.to_json() if as_json else str(report))
        raise typer.Exit(1 if report.problems(Severity(fail_on)) else 0)
