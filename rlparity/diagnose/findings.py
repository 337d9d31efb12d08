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

    def _ordered(self) -> list[Finding]:
        order = {Layer.SEMANTIC: 0, Layer.INFERENCE_PATH: 1, Layer.OBJECTIVE: 2}
        return sorted(self.findings, key=lambda f: (order[f.layer], -f.severity.rank))

    def verdict_rows(self) -> list[dict[str, str]]:
        """The compact verdict: one row per arm and layer (worst severity, the findings at that
        severity, the fix of the worst one), layers in the order to fix them."""
        rows: dict[tuple[str, Layer], list[Finding]] = {}
        for f in self._ordered():
            rows.setdefault((f.arm or "(all arms)", f.layer), []).append(f)
        out = []
        for (arm, layer), fs in rows.items():
            worst = max(f.severity.rank for f in fs)
            top = [f for f in fs if f.severity.rank == worst]
            out.append({"arm": arm, "layer": layer.value, "verdict": {0: "ok", 1: "warning", 2: "error"}[worst],
                        "findings": ", ".join(dict.fromkeys(f.name for f in top)),
                        "fix": next((f.fix for f in top if f.fix), "") if worst else ""})
        return out

    def summary_lines(self) -> list[str]:
        """One line per arm: its worst problem and the fix, or ok (what a terminal shows first)."""
        lines = []
        arms = list(dict.fromkeys(f.arm or "(all arms)" for f in self.findings))
        for arm in arms:
            probs = [f for f in self._ordered() if (f.arm or "(all arms)") == arm and f.severity.rank >= 1]
            if not probs:
                lines.append(f"{arm}: ok")
                continue
            f = probs[0]
            more = f" (+{len(probs) - 1} more)" if len(probs) > 1 else ""
            lines.append(f"{arm}: {f.layer.value}/{f.name} ({f.severity.value}){more}"
                         + (f" -> {f.fix}" if f.fix else ""))
        return lines

    def __repr__(self) -> str:
        return f"<rlparity Report {self.title!r}: {self.verdict}; " + "; ".join(self.summary_lines()) + ">"

    def __str__(self) -> str:
        fs = self._ordered()
        body = "\n".join(str(f) for f in fs) if fs else "(no findings)"
        return f"{self.title}: {self.verdict}\n{body}"

    def _repr_html_(self) -> str:
        """A compact verdict first (one row per arm and layer, with the fix), every finding with its
        evidence folded away below it."""
        colors = {"error": "#c0392b", "warning": "#d68910", "info": "#2874a6", "ok": "#1e8449"}
        rows = "".join(
            f"<tr><td>{html.escape(r['arm'])}</td><td>{r['layer']}</td>"
            f"<td style='color:{colors[r['verdict']]};font-weight:bold'>{r['verdict']}</td>"
            f"<td><code>{html.escape(r['findings'])}</code></td><td>{html.escape(r['fix'])}</td></tr>"
            for r in self.verdict_rows())
        details = []
        for f in self._ordered():
            ev = "".join(f"<li>{html.escape(k)}: {html.escape(_fmt(v))}</li>" for k, v in f.evidence.items())
            details.append(
                f"<details><summary><span style='color:{colors[f.severity.value]}'>{f.severity.value}</span> "
                f"{f.layer.value}/<code>{html.escape(f.name)}</code>"
                f"{' (arm ' + html.escape(f.arm) + ')' if f.arm else ''}: {html.escape(f.summary)}</summary>"
                f"<ul style='font-size:85%'>{ev}</ul>"
                f"{'<p><b>fix:</b> ' + html.escape(f.fix) + '</p>' if f.fix else ''}</details>")
        return (f"<div class='rlparity-report'><p><b>{html.escape(self.title)}</b>: {html.escape(self.verdict)}</p>"
                "<table><thead><tr><th>arm</th><th>layer</th><th>verdict</th><th>findings</th><th>fix</th></tr>"
                f"</thead><tbody>{rows}</tbody></table>"
                f"<details><summary>all {len(self.findings)} findings with their evidence</summary>"
                + "".join(details) + "</details></div>")
