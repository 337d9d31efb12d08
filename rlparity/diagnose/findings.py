"""Findings and reports: what every diagnosis returns.

A :class:`Finding` names the layer that is wrong (semantic / inference path / objective), how
bad it is, the evidence (numbers, with the pair and direction they were computed on) and the
fix in the user's terms. A :class:`Report` is a list of findings that prints well in a
terminal (``str``), renders in a notebook (``_repr_html_``) and serialises to JSON.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Layer(str, Enum):
    SEMANTIC = "semantic"
    INFERENCE_PATH = "inference_path"
    OBJECTIVE = "objective"


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return {"info": 0, "warning": 1, "error": 2}[self.value]


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem (or an explicit all-clear with severity ``info``)."""

    layer: Layer
    name: str
    severity: Severity
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    arm: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer"] = self.layer.value
        d["severity"] = self.severity.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(**{**d, "layer": Layer(d["layer"]), "severity": Severity(d["severity"])})

    def __str__(self) -> str:
        head = f"[{self.severity.value.upper():7}] {self.layer.value}/{self.name}"
        if self.arm:
            head += f" (arm {self.arm})"
        lines = [head, f"    {self.summary}"]
        for k, v in self.evidence.items():
            lines.append(f"    - {k}: {_fmt(v)}")
        if self.fix:
            lines.append(f"    fix: {self.fix}")
        return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


@dataclass
class Report:
    """An ordered collection of findings with a verdict."""

    findings: list[Finding] = field(default_factory=list)
    title: str = "rlparity findings"
    context: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)

    def extend(self, findings: Iterable[Finding]) -> Report:
        self.findings.extend(findings)
        return self

    def by_layer(self, layer: Layer | str) -> list[Finding]:
        layer = Layer(layer)
        return [f for f in self.findings if f.layer == layer]

    def names(self, min_severity: Severity | str = Severity.WARNING) -> set[str]:
        """Names of findings at or above ``min_severity``."""
        rank = Severity(min_severity).rank
        return {f.name for f in self.findings if f.severity.rank >= rank}

    def problems(self, min_severity: Severity | str = Severity.WARNING) -> list[Finding]:
        rank = Severity(min_severity).rank
        return [f for f in self.findings if f.severity.rank >= rank]

    @property
    def has_errors(self) -> bool:
        return any(f.severity == Severity.ERROR for f in self.findings)

    @property
    def verdict(self) -> str:
        worst = max((f.severity.rank for f in self.findings), default=0)
        return {0: "parity: no problem found", 1: "warnings: look at the findings",
                2: "broken: fix the errors below, in layer order"}[worst]

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "verdict": self.verdict, "context": self.context,
                "findings": [f.to_dict() for f in self.findings]}

    def to_json(self, **kw: Any) -> str:
        """Strict JSON (NaN and infinities as ``null``)."""
        from rlparity.config.provenance import to_json

        return to_json(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        return cls([Finding.from_dict(f) for f in d["findings"]], d.get("title", "rlparity findings"),
                   d.get("context", {}))

    def __str__(self) -> str:
        order = {Layer.SEMANTIC: 0, Layer.INFERENCE_PATH: 1, Layer.OBJECTIVE: 2}
        fs = sorted(self.findings, key=lambda f: (order[f.layer], -f.severity.rank))
        body = "\n".join(str(f) for f in fs) if fs else "(no findings)"
        return f"{self.title}: {self.verdict}\n{body}"

    def _repr_html_(self) -> str:
        colors = {"error": "#c0392b", "warning": "#d68910", "info": "#2874a6"}
        rows = []
        for f in self.findings:
            ev = "<br>".join(f"{html.escape(k)}: {html.escape(_fmt(v))}" for k, v in f.evidence.items())
            rows.append(
                f"<tr><td style='color:{colors[f.severity.value]};font-weight:bold'>{f.severity.value}</td>"
                f"<td>{f.layer.value}</td><td><code>{html.escape(f.name)}</code>"
                f"{'<br>arm ' + html.escape(f.arm) if f.arm else ''}</td>"
                f"<td>{html.escape(f.summary)}</td><td style='font-size:85%'>{ev}</td>"
                f"<td>{html.escape(f.fix)}</td></tr>")
        return (f"<div><b>{html.escape(self.title)}</b>: {html.escape(self.verdict)}"
                "<table><thead><tr><th>severity</th><th>layer</th><th>finding</th><th>summary</th>"
                "<th>evidence</th><th>fix</th></tr></thead><tbody>" + "".join(rows)
                + "</tbody></table></div>")
