"""Reports: the findings of a diagnosis with a verdict, and per arm the attribution.

A :class:`Report` is an ordered list of :class:`~rlparity.diagnose.findings.Finding` that says which
cause explains most of each arm's mismatch (the headline), prints well in a terminal (``str``),
renders in a notebook (``_repr_html_``) and serialises to JSON.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rlparity.diagnose.findings import _COLORS, CATALOGUE_URL, Finding, Layer, Severity, catalogue_link


@dataclass
class Report:
    """An ordered collection of findings with a verdict, and per arm the attribution.

    The attribution says which cause explains most of the measured mismatch (the headline) and
    which others are also present. ``str()`` prints it for a terminal, ``_repr_html_`` renders it
    in a notebook, :meth:`to_json` serialises it.

    Parameters
    ----------
    findings : list of Finding, optional
        The findings.
    title : str, default "rlparity findings"
        The report's title.
    context : dict, optional
        What was diagnosed: arms, options, a lazy sample.
    attribution : dict, optional
        Per arm, the attribution record (:func:`rlparity.diagnose.attribution.attribute`).
    """

    findings: list[Finding] = field(default_factory=list)
    title: str = "rlparity findings"
    context: dict[str, Any] = field(default_factory=dict)
    attribution: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)

    def extend(self, findings: Iterable[Finding]) -> Report:
        """Append findings, in place.

        Parameters
        ----------
        findings : iterable of Finding
            The findings to add.

        Returns
        -------
        Report
            The report itself.
        """
        self.findings.extend(findings)
        return self

    def by_layer(self, layer: Layer | str) -> list[Finding]:
        """The findings of one layer.

        Parameters
        ----------
        layer : Layer or str
            The layer (or its value).

        Returns
        -------
        list of Finding
            Its findings, in report order.
        """
        layer = Layer(layer)
        return [f for f in self.findings if f.layer == layer]

    def names(self, min_severity: Severity | str = Severity.WARNING) -> set[str]:
        """Names of the findings at or above ``min_severity``.

        Parameters
        ----------
        min_severity : Severity or str, default Severity.WARNING
            The lowest severity counted.

        Returns
        -------
        set of str
            The finding codes.
        """
        rank = Severity(min_severity).rank
        return {f.name for f in self.findings if f.severity.rank >= rank}

    def causes(self, arm: str | None = None, min_severity: Severity | str = Severity.WARNING) -> set[str]:
        """The causes named at or above ``min_severity``.

        Parameters
        ----------
        arm : str, optional
            One arm's; None: of all arms.
        min_severity : Severity or str, default Severity.WARNING
            The lowest severity counted.

        Returns
        -------
        set of str
            The causes (keys of :data:`rlparity.diagnose.causes.CAUSES`).
        """
        rank = Severity(min_severity).rank
        return {f.cause for f in self.findings if f.cause and f.severity.rank >= rank
                and (arm is None or f.arm == arm)}

    def problems(self, min_severity: Severity | str = Severity.WARNING) -> list[Finding]:
        """The findings at or above ``min_severity``.

        Parameters
        ----------
        min_severity : Severity or str, default Severity.WARNING
            The lowest severity counted.

        Returns
        -------
        list of Finding
            In report order.
        """
        rank = Severity(min_severity).rank
        return [f for f in self.findings if f.severity.rank >= rank]

    @property
    def has_errors(self) -> bool:
        """Whether any finding is an error.

        Returns
        -------
        bool
            True with at least one ERROR.
        """
        return any(f.severity == Severity.ERROR for f in self.findings)

    @property
    def verdict(self) -> str:
        """The report's verdict, from its worst severity.

        Returns
        -------
        str
            ``"parity: no problem found"``, ``"warnings: look at the findings"`` or ``"broken: fix the
            errors below, in layer order"``.
        """
        worst = max((f.severity.rank for f in self.findings), default=0)
        return {0: "parity: no problem found", 1: "warnings: look at the findings",
                2: "broken: fix the errors below, in layer order"}[worst]

    def headline(self, arm: str | None) -> Finding | None:
        """The arm's headline: the finding whose cause explains the largest share of the measured mismatch.

        See :mod:`rlparity.diagnose.attribution`; without an attribution, the arm's first problem in
        layer order.

        Parameters
        ----------
        arm : str or None
            The arm; None for the findings over all arms.

        Returns
        -------
        Finding or None
            The headline; ``None`` when the arm has no problem.
        """
        key = arm or "(all arms)"
        probs = [f for f in self._ordered() if (f.arm or "(all arms)") == key and f.severity.rank >= 1]
        if not probs:
            return None
        name = (self.attribution.get(key) or {}).get("headline")
        return next((f for f in probs if f.name == name), probs[0])

    def also(self, arm: str | None) -> list[Finding]:
        """The arm's other problems, after the headline.

        Parameters
        ----------
        arm : str or None
            The arm; None for the findings over all arms.

        Returns
        -------
        list of Finding
            Backend layers before the objective, then by severity and share.
        """
        head = self.headline(arm)
        key = arm or "(all arms)"
        return [f for f in self._ordered() if (f.arm or "(all arms)") == key and f.severity.rank >= 1 and f is not head]

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data.

        Returns
        -------
        dict
            ``title``, ``verdict``, ``context``, ``attribution`` and ``findings`` (each
            :meth:`Finding.to_dict`).
        """
        return {"title": self.title, "verdict": self.verdict, "context": self.context,
                "attribution": self.attribution, "findings": [f.to_dict() for f in self.findings]}

    def to_json(self, **kw: Any) -> str:
        """The report as strict JSON (NaN and infinities as ``null``).

        Parameters
        ----------
        **kw
            Passed to :func:`rlparity.config.provenance.to_json` (e.g. ``indent``).

        Returns
        -------
        str
            The JSON text.
        """
        from rlparity.config.provenance import to_json

        return to_json(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """A report from :meth:`to_dict`'s output.

        Parameters
        ----------
        d : dict
            ``findings`` and optionally ``title``, ``context`` and ``attribution``.

        Returns
        -------
        Report
            The report.
        """
        return cls([Finding.from_dict(f) for f in d["findings"]], d.get("title", "rlparity findings"),
                   d.get("context", {}), d.get("attribution", {}))

    def _ordered(self) -> list[Finding]:
        order = {Layer.SEMANTIC: 0, Layer.INFERENCE_PATH: 1, Layer.OBJECTIVE: 2}
        return sorted(self.findings, key=lambda f: (order[f.layer], -f.severity.rank, -(f.share or 0.0)))

    def _arms(self) -> list[str]:
        return list(dict.fromkeys(f.arm or "(all arms)" for f in self.findings))

    def verdict_rows(self) -> list[dict[str, str]]:
        """The compact verdict: one row per arm and layer, layers in the order to fix them.

        Returns
        -------
        list of dict of str to str
            ``arm``, ``layer``, ``verdict`` (the worst severity, ``"ok"`` for information), ``findings``
            (the codes at that severity), ``fix`` (of the worst one) and ``headline`` (``"yes"`` on the
            row holding the arm's headline).
        """
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
        """One arm's headline in one line.

        Parameters
        ----------
        arm : str or None
            The arm; None for the findings over all arms.

        Returns
        -------
        str
            ``arm: layer/name (severity, explains 83% ...) -> fix; also: X, Y``, or ``arm: ok``.
        """
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
        """One line per arm: its headline and the fix, then what else is wrong; or ok.

        What a terminal shows first.

        Returns
        -------
        list of str
            :meth:`headline_line` of every arm.
        """
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

    def groups(self, min_severity: Severity | str = Severity.WARNING) -> list[dict[str, Any]]:
        """The problems at or above ``min_severity``, one group per code, severity and fix.

        In the order to fix them (layers, then severity, then share); the same fix on several arms is
        one group.

        Parameters
        ----------
        min_severity : Severity or str, default Severity.WARNING
            The lowest severity counted.

        Returns
        -------
        list of dict
            ``{"finding", "arms", "headline_arms"}``, the finding being the group's first (the one with
            the largest share).
        """
        rank = Severity(min_severity).rank
        heads = {a: self.headline(None if a == "(all arms)" else a) for a in self._arms()}
        out: dict[tuple, dict[str, Any]] = {}
        for f in self._ordered():
            if f.severity.rank < rank:
                continue
            arm = f.arm or "(all arms)"
            g = out.setdefault((f.layer, f.name, f.severity, f.fix), {"finding": f, "arms": [], "headline_arms": []})
            if arm not in g["arms"]:
                g["arms"].append(arm)
            if heads.get(arm) is f:
                g["headline_arms"].append(arm)
        return list(out.values())

    def info_counts(self) -> dict[str, int]:
        """How many findings below WARNING each code has.

        Information and all-clears, not the verdicts another cause explains
        (:meth:`explained_counts`): what a compact rendering collapses into one line.

        Returns
        -------
        dict of str to int
            ``{code: count}``.
        """
        counts: dict[str, int] = {}
        for f in self._ordered():
            if f.severity.rank == 0 and not f.explained_by:
                counts[f.name] = counts.get(f.name, 0) + 1
        return counts

    def explained_counts(self) -> dict[tuple[str, str], int]:
        """How many verdicts of each code another cause explains (demoted to information by the attribution).

        Returns
        -------
        dict of (str, str) to int
            ``{(code, explaining cause): count}``.
        """
        counts: dict[tuple[str, str], int] = {}
        for f in self._ordered():
            if f.explained_by:
                counts[(f.name, f.explained_by)] = counts.get((f.name, f.explained_by), 0) + 1
        return counts

    def ok_arms(self) -> list[str]:
        """The arms with no finding at WARNING or above (findings over all arms are no arm).

        Returns
        -------
        list of str
            The arms, in report order.
        """
        return [a for a in self._arms() if a != "(all arms)" and self.headline(a) is None]

    def to_html(self, *, catalogue: str | None = CATALOGUE_URL, evidence: bool = True) -> str:
        """The compact report a notebook shows (``_repr_html_``).

        The verdict; one row per problem (the same code, severity and fix on several arms is one row
        naming the arms, the headline arms marked), its fix on a full-width row below; the arms with
        no problem and the information findings collapsed into counts. Codes link to their entry in
        the findings catalogue.

        Parameters
        ----------
        catalogue : str or None, default CATALOGUE_URL
            The catalogue page's URL; None: no links.
        evidence : bool, default True
            Also list every finding with its evidence, folded away.

        Returns
        -------
        str
            An HTML fragment.
        """
        rows = []
        for g in self.groups():
            f = g["finding"]
            sev = f.severity.value
            arms = ", ".join(html.escape(a) + (" &#9733;" if a in g["headline_arms"] else "") for a in g["arms"])
            first = f"arm {html.escape(g['arms'][0])}: " if len(g["arms"]) > 1 else ""
            att = f"<br><small>{html.escape(f.attribution)}</small>" if f.attribution else ""
            rows.append(f"<tr><td style='color:{_COLORS[sev]};font-weight:bold'>{sev}</td>"
                        f"<td>{f.layer.value}/{catalogue_link(f.name, catalogue)}<br>"
                        f"<small>{first}{html.escape(f.summary)}</small>{att}</td><td>{arms}</td></tr>")
            if f.fix:
                rows.append(f"<tr><td></td><td colspan='2'><b>fix:</b> {html.escape(f.fix)}</td></tr>")
        parts = [f"<div class='rlparity-report'><p><b>{html.escape(self.title)}</b>: {html.escape(self.verdict)}</p>"]
        if rows:
            parts.append("<table><thead><tr><th>severity</th><th>finding (&#9733; the arm's headline: the cause that "
                         "explains most of its mismatch)</th><th>arms</th></tr></thead>"
                         f"<tbody>{''.join(rows)}</tbody></table>")
        ok = self.ok_arms()
        if ok:
            parts.append(f"<p><span style='color:{_COLORS['ok']};font-weight:bold'>ok</span> ({len(ok)} arm"
                         f"{'s' if len(ok) > 1 else ''}, no problem): {html.escape(', '.join(ok))}</p>")
        info = self.info_counts()
        if info:
            listed = ", ".join(f"{catalogue_link(k, catalogue)}" + (f" &times;{n}" if n > 1 else "")
                               for k, n in info.items())
            parts.append(f"<p><small>{sum(info.values())} information finding{'s' if sum(info.values()) > 1 else ''}"
                         f": {listed}</small></p>")
        explained = self.explained_counts()
        if explained:
            listed = ", ".join(f"{catalogue_link(k, catalogue)}" + (f" &times;{n}" if n > 1 else "")
                               + f" (by {html.escape(by)})" for (k, by), n in explained.items())
            parts.append(f"<p><small>{sum(explained.values())} verdict{'s' if sum(explained.values()) > 1 else ''} "
                         f"another cause explains: {listed}</small></p>")
        if evidence and self.findings:
            details = "".join(f.to_html(catalogue=catalogue) for f in self._ordered())
            parts.append(f"<details><summary>all {len(self.findings)} findings with their evidence</summary>"
                         f"{details}</details>")
        return "".join(parts) + "</div>"

    def _repr_html_(self) -> str:
        """The compact rendering (:meth:`to_html`)."""
        return self.to_html()
