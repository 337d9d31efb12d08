"""Findings and reports: what every diagnosis returns.

A :class:`Finding` names the layer that is wrong (semantic / inference path / objective), how
bad it is, the evidence (numbers, with the pair and direction they were computed on) and the
fix in the user's terms. A :class:`Report` is a list of findings that prints well in a
terminal (``str``), renders in a notebook (``_repr_html_``) and serialises to JSON.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any


# where a rendered report links each finding code: the book's catalogue page, relative to a chapter
# (book/notebooks/NN.html -> book/reference/findings.html); ``Report.to_html(catalogue=...)`` takes another
CATALOGUE_URL = "../reference/findings.html"


def catalogue_anchor(code: str) -> str:
    """The anchor of a finding code on the catalogue page (a Sphinx label: lower case, ``-`` for ``_``)."""
    return "finding-" + code.lower().replace("_", "-")


def catalogue_link(code: str, catalogue: str | None = CATALOGUE_URL) -> str:
    """``<a href=CATALOGUE#anchor><code>code</code></a>``: a finding code linked to its catalogue entry
    (the code alone when ``catalogue`` is ``None``)."""
    text = f"<code>{html.escape(code)}</code>"
    if not catalogue:
        return text
    return (f"<a href='{html.escape(catalogue)}#{catalogue_anchor(code)}' "
            f"title='what {html.escape(code)} means and how to fix it'>{text}</a>")


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
    """One diagnosed problem (or an explicit all-clear with severity ``info``).

    Attribution (filled by :func:`rlparity.diagnose.attribution.attribute` for the findings of an
    arm): ``cause`` is the cause the finding claims (a key of
    :data:`rlparity.diagnose.causes.CAUSES`, ``None`` for information and all-clears), ``tokens``
    says which tokens it explains (``{"scope", "n_tokens", "n_sequences"}``), ``share`` the share of
    the arm's measured excess mismatch (over the floor) it accounts for, and ``explained_by`` the
    cause that explains a verdict demoted to information.
    """

    layer: Layer
    name: str
    severity: Severity
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    arm: str | None = None
    cause: str | None = None
    tokens: dict[str, Any] | None = None
    share: float | None = None
    explained_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer"] = self.layer.value
        d["severity"] = self.severity.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(**{**d, "layer": Layer(d["layer"]), "severity": Severity(d["severity"])})

    def with_(self, **changes: Any) -> Finding:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @property
    def attribution(self) -> str:
        """``"explains 83% of the excess mismatch on 512 tokens"`` / ``"explained by X"`` / ``""``."""
        if self.explained_by:
            return f"explained by {self.explained_by}"
        if self.share is None:
            return ""
        where = f" on {self.tokens['n_tokens']} tokens ({self.tokens.get('scope', '')})" if self.tokens else ""
        return f"explains {self.share:.0%} of the excess mismatch{where}"

    def __str__(self) -> str:
        head = f"[{self.severity.value.upper():7}] {self.layer.value}/{self.name}"
        if self.arm:
            head += f" (arm {self.arm})"
        lines = [head, f"    {self.summary}"]
        if self.attribution:
            lines.append(f"    ({self.attribution})")
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
    """An ordered collection of findings with a verdict, and per arm the attribution: which cause
    explains most of the measured mismatch (the headline) and which others are also present."""

    findings: list[Finding] = field(default_factory=list)
    title: str = "rlparity findings"
    context: dict[str, Any] = field(default_factory=dict)
    attribution: dict[str, dict[str, Any]] = field(default_factory=dict)

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

    def causes(self, arm: str | None = None, min_severity: Severity | str = Severity.WARNING) -> set[str]:
        """The causes named at or above ``min_severity`` (of one arm, or of all)."""
        rank = Severity(min_severity).rank
        return {f.cause for f in self.findings if f.cause and f.severity.rank >= rank
                and (arm is None or f.arm == arm)}

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

    def headline(self, arm: str | None) -> Finding | None:
        """The arm's headline: the finding whose cause explains the largest share of the measured
        mismatch (see :mod:`rlparity.diagnose.attribution`); without an attribution, its first
        problem in layer order; ``None`` when the arm has no problem."""
        key = arm or "(all arms)"
        probs = [f for f in self._ordered() if (f.arm or "(all arms)") == key and f.severity.rank >= 1]
        if not probs:
            return None
        name = (self.attribution.get(key) or {}).get("headline")
        return next((f for f in probs if f.name == name), probs[0])

    def also(self, arm: str | None) -> list[Finding]:
        """The arm's other problems, after the headline: backend layers before the objective, then by share."""
        head = self.headline(arm)
        key = arm or "(all arms)"
        return [f for f in self._ordered() if (f.arm or "(all arms)") == key and f.severity.rank >= 1 and f is not head]

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "verdict": self.verdict, "context": self.context,
                "attribution": self.attribution, "findings": [f.to_dict() for f in self.findings]}

    def to_json(self, **kw: Any) -> str:
        """Strict JSON (NaN and infinities as ``null``)."""
        from rlparity.config.provenance import to_json

        return to_json(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        return cls([Finding.from_dict(f) for f in d["findings"]], d.get("title", "rlparity findings"),
                   d.get("context", {}), d.get("attribution", {}))

    def _ordered(self) -> list[Finding]:
        order = {Layer.SEMANTIC: 0, Layer.INFERENCE_PATH: 1, Layer.OBJECTIVE: 2}
        return sorted(self.findings, key=lambda f: (order[f.layer], -f.severity.rank, -(f.share or 0.0)))

    def _arms(self) -> list[str]:
        return list(dict.fromkeys(f.arm or "(all arms)" for f in self.findings))

    def verdict_rows(self) -> list[dict[str, str]]:
        """The compact verdict: one row per arm and layer (worst severity, the findings at that
        severity, the fix of the worst one), layers in the order to fix them; the row holding the
        arm's headline is marked."""
        rows: dict[tuple[str, Layer], list[Finding]] = {}
        for f in self._ordered():
            rows.setdefault((f.arm or "(all arms)", f.layer), []).append(f)
        heads = {a: self.headline(None if a == "(all arms)" else a) for a in self._arms()}
        out = []
        for (arm, layer), fs in rows.items():
            worst = max(f.severity.rank for f in fs)
            top = [f for f in fs if f.severity.rank == worst]
            head = heads.get(arm)
            out.append({"arm": arm, "layer": layer.value, "verdict": {0: "ok", 1: "warning", 2: "error"}[worst],
                        "findings": ", ".join(dict.fromkeys(f.name for f in top)),
                        "fix": next((f.fix for f in top if f.fix), "") if worst else "",
                        "headline": "yes" if head is not None and head in fs else ""})
        return out

    def headline_line(self, arm: str | None) -> str:
        """``arm: layer/name (severity, explains 83% ...) -> fix; also: X, Y`` or ``arm: ok``."""
        key = arm or "(all arms)"
        head = self.headline(arm)
        if head is None:
            return f"{key}: ok"
        share = f", {head.attribution}" if head.share is not None else ""
        also = self.also(arm)
        more = f"; also: {', '.join(dict.fromkeys(f.name for f in also))}" if also else ""
        return (f"{key}: {head.layer.value}/{head.name} ({head.severity.value}{share})"
                + (f" -> {head.fix}" if head.fix else "") + more)

    def summary_lines(self) -> list[str]:
        """One line per arm: its headline and the fix, then what else is wrong; or ok (what a
        terminal shows first)."""
        return [self.headline_line(None if a == "(all arms)" else a) for a in self._arms()]

    def __repr__(self) -> str:
        return f"<rlparity Report {self.title!r}: {self.verdict}; " + "; ".join(self.summary_lines()) + ">"

    def __str__(self) -> str:
        fs = self._ordered()
        body = "\n".join(str(f) for f in fs) if fs else "(no findings)"
        heads = [line for line in self.summary_lines() if not line.endswith(": ok")]
        top = ("headlines (the cause that explains most of each arm's mismatch):\n  " + "\n  ".join(heads) + "\n"
               if heads else "")
        return f"{self.title}: {self.verdict}\n{top}{body}"

    def _repr_html_(self) -> str:
        """A compact verdict first (one row per arm: the headline cause with its share and fix, and
        what else is wrong), every finding with its evidence folded away below it."""
        colors = {"error": "#c0392b", "warning": "#d68910", "info": "#2874a6", "ok": "#1e8449"}
        rows = []
        for a in self._arms():
            arm = None if a == "(all arms)" else a
            head = self.headline(arm)
            if head is None:
                rows.append(f"<tr><td>{html.escape(a)}</td><td style='color:{colors['ok']};font-weight:bold'>ok</td>"
                            "<td></td><td></td><td></td></tr>")
                continue
            also = ", ".join(dict.fromkeys(f.name for f in self.also(arm)))
            rows.append(
                f"<tr><td>{html.escape(a)}</td>"
                f"<td style='color:{colors[head.severity.value]};font-weight:bold'>{head.severity.value}</td>"
                f"<td>{head.layer.value}/{catalogue_link(head.name)}"
                f"{'<br><small>' + html.escape(head.attribution) + '</small>' if head.attribution else ''}</td>"
                f"<td>{html.escape(head.fix)}</td><td><code>{html.escape(also)}</code></td></tr>")
        details = []
        for f in self._ordered():
            ev = "".join(f"<li>{html.escape(k)}: {html.escape(_fmt(v))}</li>" for k, v in f.evidence.items())
            att = f" <small>({html.escape(f.attribution)})</small>" if f.attribution else ""
            details.append(
                f"<details><summary><span style='color:{colors[f.severity.value]}'>{f.severity.value}</span> "
                f"{f.layer.value}/{catalogue_link(f.name)}"
                f"{' (arm ' + html.escape(f.arm) + ')' if f.arm else ''}: {html.escape(f.summary)}{att}</summary>"
                f"<ul style='font-size:85%'>{ev}</ul>"
                f"{'<p><b>fix:</b> ' + html.escape(f.fix) + '</p>' if f.fix else ''}</details>")
        return (f"<div class='rlparity-report'><p><b>{html.escape(self.title)}</b>: {html.escape(self.verdict)}</p>"
                "<table><thead><tr><th>arm</th><th>verdict</th><th>headline (what explains most of the mismatch)</th>"
                "<th>fix</th><th>also</th></tr>"
                f"</thead><tbody>{''.join(rows)}</tbody></table>"
                f"<details><summary>all {len(self.findings)} findings with their evidence</summary>"
                + "".join(details) + "</details></div>")
