"""The parity gate behind ``rlparity check``: metric limits, forbidden findings and the worst
allowed severity, from :class:`~rlparity.config.CheckThresholds` (defaults in
:func:`rlparity.config.defaults`; ``rlparity/data/check.yaml`` is the same as a file to copy)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from rlparity.config.defaults import CheckThresholds, defaults
from rlparity.config.files import read_yaml_mapping
from rlparity.diagnose import diagnose
from rlparity.diagnose.findings import Severity, _fmt
from rlparity.diagnose.report import Report
from rlparity.metrics import summary, trainer_side, zero_prob_tokens
from rlparity.trace import as_arms


Thresholds = CheckThresholds


def default_thresholds_path() -> Path:
    """The path of the shipped ``rlparity/data/check.yaml`` (the defaults as a file to copy).

    Returns
    -------
    pathlib.Path
        The file inside the installed package.
    """
    return Path(str(resources.files("rlparity") / "data" / "check.yaml"))


def load_thresholds(path: str | os.PathLike | None = None) -> Thresholds:
    """The thresholds of the parity gate, from YAML or the defaults in effect.

    Parameters
    ----------
    path : str or os.PathLike, optional
        A YAML file of :class:`~rlparity.config.CheckThresholds` fields; None: the defaults in
        effect (:func:`rlparity.config.defaults`, which the shipped ``check.yaml`` mirrors).

    Returns
    -------
    CheckThresholds
        The validated thresholds.

    Raises
    ------
    ValueError
        If the file is not a mapping or holds an invalid key or value (the message names the bad
        key and the valid ones).
    """
    if path is None:
        return defaults().check
    p = Path(path)
    data = read_yaml_mapping(p, where=f"thresholds file {p}", fix=f"start from {default_thresholds_path()}")
    try:
        return Thresholds(**data)
    except ValidationError as err:
        lines = [f"{'.'.join(map(str, e['loc'])) or '(file)'}: {e['msg']}" for e in err.errors()]
        raise ValueError(f"{p} has invalid thresholds: {'; '.join(lines)} "
                         f"(valid keys: {', '.join(sorted(Thresholds.model_fields))})") from None


@dataclass
class Check:
    """One line of the parity gate: a metric or rule of one arm against its limit.

    Parameters
    ----------
    arm : str
        The arm checked.
    name : str
        The metric or rule (``"abs_log_ratio_mean"``, ``"forbidden_findings"``, ...).
    value : object
        The arm's value (nats for logprob metrics; the names found for finding rules).
    limit : str
        The limit, as text (``"<= 0.02"``, ``"in [0.98, 1.02]"``, ``"none"``).
    passed : bool
        Whether the value is within the limit (NaN and inf fail).
    """
    arm: str
    name: str
    value: Any
    limit: str
    passed: bool


@dataclass
class CheckResult:
    """The parity gate's result: every check of every arm, and the report it judged.

    Parameters
    ----------
    checks : list of Check, optional
        The checks, arm by arm.
    report : Report, optional
        The diagnosis the finding rules read.
    """
    checks: list[Check] = field(default_factory=list)
    report: Report = field(default_factory=Report)

    @property
    def passed(self) -> bool:
        """Whether every check passed.

        Returns
        -------
        bool
            True when parity holds by every limit.
        """
        return all(c.passed for c in self.checks)

    def __str__(self) -> str:
        head = "rlparity check: PASS (parity holds)" if self.passed else "rlparity check: FAIL (parity broken)"
        # what to fix first: the attributed headline of every arm that has a problem
        heads = [f"  {line}" for line in self.report.summary_lines() if not line.endswith(": ok")]
        if heads:
            head += "\nheadline per arm (the cause that explains most of its mismatch):\n" + "\n".join(heads)
        rows = [f"  {'ok ' if c.passed else 'BAD'}  [{c.arm}] {c.name:<26} {_fmt(c.value):>12}   limit {c.limit}"
                for c in self.checks]
        failed = [c for c in self.checks if not c.passed]
        tail = ["", "failed: " + ", ".join(f"{c.arm}/{c.name}" for c in failed)] if failed else []
        return "\n".join([head, *rows, *tail, "", str(self.report)])

    def to_dict(self) -> dict[str, Any]:
        """The result as plain data (JSON-ready).

        Returns
        -------
        dict
            ``passed``, ``checks`` (one dict each), ``headlines`` per arm (headline, cause, share) and
            ``report`` (:meth:`Report.to_dict`).
        """
        return {"passed": self.passed, "checks": [c.__dict__ for c in self.checks],
                "headlines": {a: (r.get("headline"), r.get("cause"), r.get("share"))
                              for a, r in self.report.attribution.items()},
                "report": self.report.to_dict()}


def check(data: Any, thresholds: Thresholds | None = None) -> CheckResult:
    """Check every arm of ``data`` against the parity gate's thresholds.

    The gate reads metric limits (mean and RMS ``|d|`` in nats, k3 KL, mean ratio, clip
    fraction, zero-probability and boundary-flip shares), forbidden findings and the worst allowed
    severity; the diagnosis runs with the thresholds' trainer reading and clip ``eps``.

    Parameters
    ----------
    data : xarray.Dataset, mapping, xarray.DataTree or str
        A scored trace, ``{arm: trace}``, a DataTree or a store path.
    thresholds : CheckThresholds, optional
        The limits; None: :func:`load_thresholds` (the defaults in effect).

    Returns
    -------
    CheckResult
        The checks and the report; ``str()`` of it is the command's output.

    Raises
    ------
    ValueError
        If an arm has no response tokens.
    """
    th = thresholds or load_thresholds()
    arms = as_arms(data)
    report = diagnose(arms, title="parity findings", trainer=th.trainer, eps=th.clip_eps)
    res = CheckResult(report=report)
    for arm, ds in arms.items():
        side = trainer_side(ds, th.trainer)
        s = summary(ds, trainer=side, eps=th.clip_eps)
        val = {k: s[k].item() for k in ("abs_log_ratio_mean", "abs_log_ratio_rms", "kl_k3", "mean_ratio",
                                        "clip_fraction", "n_tokens")}
        if val["n_tokens"] == 0:
            raise ValueError(f"arm {arm!r} has no response tokens: nothing to judge (capture with max_tokens >= 1)")
        limits = [("abs_log_ratio_mean", th.max_abs_log_ratio_mean), ("abs_log_ratio_rms", th.max_abs_log_ratio_rms),
                  ("kl_k3", th.max_kl_k3), ("clip_fraction", th.max_clip_fraction)]
        for name, lim in limits:
            if lim is not None:
                v = val[name]
                res.checks.append(Check(arm, name, v, f"<= {lim}", bool(v <= lim)))  # NaN/inf fail
        if th.mean_ratio is not None:
            lo, hi = th.mean_ratio
            v = val["mean_ratio"]
            res.checks.append(Check(arm, "mean_ratio", v, f"in [{lo}, {hi}]", bool(lo <= v <= hi)))
        noise = next((f.evidence.get("noise_floor_rms") for f in report
                      if f.arm == arm and f.layer.value == "semantic" and "noise_floor_rms" in f.evidence), None)
        causes = zero_prob_tokens(ds, side, noise_rms=noise)["cause"].values
        for name, lim, which in (("zero_prob_share", th.max_zero_prob_share, ("outside", "unclassified")),
                                 ("boundary_flip_share", th.max_boundary_flip_share, ("boundary",))):
            if lim is not None:
                share = int(np.isin(causes, which).sum()) / val["n_tokens"]
                res.checks.append(Check(arm, name, share, f"<= {lim}", bool(share <= lim)))
        names = {f.name for f in report if f.arm == arm}
        bad = sorted(names & set(th.forbid_findings))
        res.checks.append(Check(arm, "forbidden_findings", ", ".join(bad) or "none", "none", not bad))
        if th.fail_on != "none":
            worst = [f.name for f in report.problems(Severity(th.fail_on)) if f.arm == arm]
            res.checks.append(Check(arm, f"findings>={th.fail_on}", ", ".join(sorted(set(worst))) or "none",
                                    "none", not worst))
    return res


__all__ = ["Check", "CheckResult", "Thresholds", "check", "default_thresholds_path", "load_thresholds"]
