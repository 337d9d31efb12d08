"""``rlparity check``: a parity gate for CI. Thresholds come from a small YAML; the result is a
readable report and an exit code (0 parity holds, 1 broken, 2 bad input)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional

import typer
import xarray as xr
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlparity.diagnose import Report, Severity


class Thresholds(BaseModel):
    """What ``rlparity check`` enforces (see ``rlparity/data/check.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trainer: Literal["processed", "raw"] = "processed"
    max_abs_log_ratio_mean: Optional[float] = Field(0.02, ge=0)
    max_abs_log_ratio_rms: Optional[float] = Field(0.05, ge=0)
    mean_ratio: Optional[tuple[float, float]] = (0.98, 1.02)
    max_clip_fraction: Optional[float] = Field(0.05, ge=0, le=1)
    clip_eps: float = Field(0.2, gt=0)
    max_zero_prob_share: Optional[float] = Field(0.0, ge=0, le=1)
    forbid_findings: list[str] = []
    fail_on: Literal["error", "warning", "none"] = "error"

    @field_validator("mean_ratio")
    @classmethod
    def _band(cls, v):
        if v is not None and not v[0] <= 1.0 <= v[1]:
            raise ValueError(f"mean_ratio band {list(v)} must contain 1.0, e.g. [0.98, 1.02]")
        return v


def default_thresholds_path() -> Path:
    return Path(str(resources.files("rlparity") / "data" / "check.yaml"))


def load_thresholds(path: str | os.PathLike | None = None) -> Thresholds:
    """Thresholds from YAML (default: the shipped ``check.yaml``); errors name the bad key."""
    import yaml

    p = Path(path) if path is not None else default_thresholds_path()
    if not p.exists():
        raise FileNotFoundError(f"no thresholds file at {p}; start from {default_thresholds_path()}")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a mapping of threshold names to values")
    try:
        return Thresholds(**data)
    except ValidationError as err:
        lines = [f"{'.'.join(map(str, e['loc'])) or '(file)'}: {e['msg']}" for e in err.errors()]
        raise ValueError(f"{p} has invalid thresholds:\n- " + "\n- ".join(lines)
                         + f"\nvalid keys: {sorted(Thresholds.model_fields)}") from None


@dataclass
class Check:
    arm: str
    name: str
    value: Any
    limit: str
    passed: bool


@dataclass
class CheckResult:
    checks: list[Check] = field(default_factory=list)
    report: Report = field(default_factory=Report)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def __str__(self) -> str:
        head = "rlparity check: PASS (parity holds)" if self.passed else "rlparity check: FAIL (parity broken)"
        rows = [f"  {'ok ' if c.passed else 'BAD'}  [{c.arm}] {c.name:<26} {_fmt(c.value):>12}   limit {c.limit}"
                for c in self.checks]
        failed = [c for c in self.checks if not c.passed]
        tail = ["", "failed: " + ", ".join(f"{c.arm}/{c.name}" for c in failed)] if failed else []
        return "\n".join([head, *rows, *tail, "", str(self.report)])

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "checks": [c.__dict__ for c in self.checks],
                "report": self.report.to_dict()}


def _fmt(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def check(data: Any, thresholds: Thresholds | None = None) -> CheckResult:
    """Check every arm of ``data`` (a scored trace, ``{arm: trace}``, a store path) against
    ``thresholds``: metric limits, forbidden findings and the worst allowed severity."""
    from rlparity.diagnose import diagnose
    from rlparity.metrics import summary
    from rlparity.trace import as_arms

    th = thresholds or load_thresholds()
    arms = as_arms(data)
    report = diagnose(arms, title="parity findings")
    res = CheckResult(report=report)
    for arm, ds in arms.items():
        s = summary(ds, trainer=th.trainer, eps=th.clip_eps)
        val = {k: s[k].item() for k in ("abs_log_ratio_mean", "abs_log_ratio_rms", "mean_ratio",
                                        "clip_fraction", "n_zero_prob", "n_tokens")}
        limits = [("abs_log_ratio_mean", th.max_abs_log_ratio_mean), ("abs_log_ratio_rms", th.max_abs_log_ratio_rms),
                  ("clip_fraction", th.max_clip_fraction)]
        for name, lim in limits:
            if lim is not None:
                v = val[name]
                res.checks.append(Check(arm, name, v, f"<= {lim}", bool(v <= lim)))  # NaN/inf fail
        if th.mean_ratio is not None:
            lo, hi = th.mean_ratio
            v = val["mean_ratio"]
            res.checks.append(Check(arm, "mean_ratio", v, f"in [{lo}, {hi}]", bool(lo <= v <= hi)))
        if th.max_zero_prob_share is not None:
            share = val["n_zero_prob"] / max(val["n_tokens"], 1)
            res.checks.append(Check(arm, "zero_prob_share", share, f"<= {th.max_zero_prob_share}",
                                    bool(share <= th.max_zero_prob_share)))
        names = {f.name for f in report if f.arm == arm}
        bad = sorted(names & set(th.forbid_findings))
        res.checks.append(Check(arm, "forbidden_findings", ", ".join(bad) or "none", "none", not bad))
        if th.fail_on != "none":
            worst = [f.name for f in report.problems(Severity(th.fail_on)) if f.arm == arm]
            res.checks.append(Check(arm, f"findings>={th.fail_on}", ", ".join(sorted(set(worst))) or "none",
                                    "none", not worst))
    return res


def register(app: typer.Typer) -> None:
    @app.command("check")
    def check_cmd(
        trace: Optional[Path] = typer.Argument(None, help="scored zarr store; omit to capture with --model"),
        thresholds: Optional[Path] = typer.Option(None, help="thresholds YAML (default: rlparity/data/check.yaml)"),
        model: Optional[str] = typer.Option(None, help="capture first: model path or hub id ('tiny' = built-in)"),
        engine: Optional[str] = typer.Option(None, help="engine settings as JSON (with --model)"),
        profile: Optional[str] = typer.Option(None, help="named or YAML engine profile (with --model)"),
        num_prompts: int = 16,
        max_tokens: int = 24,
        temperature: float = 0.7,
        top_k: int = 20,
        out: Optional[Path] = typer.Option(None, help="where to keep the captured trace (with --model)"),
        as_json: bool = typer.Option(False, "--json"),
    ):
        """Fail (exit 1) when rollout and trainer logprobs are not at parity; 0 when they are."""
        import json

        from rlparity.trace import TraceValidationError

        try:
            th = load_thresholds(thresholds)
        except (FileNotFoundError, ValueError) as err:
            typer.echo(str(err), err=True)
            raise typer.Exit(2) from err
        if (trace is None) == (model is None):
            typer.echo("give either a TRACE store or --model to capture one", err=True)
            raise typer.Exit(2)
        try:
            data: Any = trace if trace is not None else _capture(model, engine, profile, num_prompts,
                                                                 max_tokens, temperature, top_k, out)
            result = check(data, th)
        except (FileNotFoundError, TraceValidationError) as err:
            typer.echo(f"cannot check: {err}", err=True)
            raise typer.Exit(2) from err
        typer.echo(json.dumps(result.to_dict(), indent=2, default=str) if as_json else str(result))
        raise typer.Exit(0 if result.passed else 1)


def _capture(model, engine_json, profile, num_prompts, max_tokens, temperature, top_k, out) -> dict[str, xr.Dataset]:
    from rlparity.capture import Engine, SamplingSettings
    from rlparity.cli import _engine_settings
    from rlparity.models import make_model, make_prompts
    from rlparity.score import score
    from rlparity.trace import add_arm

    if model == "tiny":
        model = str(make_model("tiny", progress=False))
    settings = _engine_settings(engine_json, profile)
    sampling = SamplingSettings(temperature=temperature, top_k=top_k, max_tokens=max_tokens)
    with Engine(model, settings) as eng:
        trace = eng.capture(make_prompts(num_prompts), sampling, arm="check", progress=False)
    if out is not None:
        add_arm(trace, out, "check")  # keep the rollout even if rescoring fails
    trace = score(trace, model, progress=False)
    if out is not None:
        add_arm(trace, out, "check")
    return {"check": trace}
