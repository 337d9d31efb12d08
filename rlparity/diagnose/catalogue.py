"""The catalogue of finding codes: every ``Finding.name`` a diagnosis can emit, collected from the
topics that declare them (each topic module's ``TOPIC.codes``, :mod:`rlparity.diagnose.topic`).

Each :class:`FindingCode` says which layer emits it, at which severities, what it means, the rule
that decides it with the thresholds it reads (a field of :func:`rlparity.config.defaults`, or a
module constant) and what those thresholds were calibrated on, and the fix in the user's terms.
The fixes are the checks' own constants where the check has one, so the catalogue and the
findings say the same thing.

``catalogue()`` is the registry; :func:`thresholds` reads each threshold's value and description
from the code at the moment it is called; :func:`catalogue_markdown` is the book's page
``book/reference/findings.md`` (written by the book build, one anchor per code, see
:func:`rlparity.diagnose.findings.catalogue_anchor`); ``rlparity findings [CODE]`` prints it in a
terminal. ``tests/test_catalogue.py`` holds the registry to the source: the codes listed here are
exactly the names the package's ``Finding(...)`` calls can take.
"""

from __future__ import annotations

from typing import Any

from rlparity.diagnose.findings import Layer
from rlparity.diagnose.topic import FindingCode, thresholds, topics


def catalogue() -> dict[str, FindingCode]:
    """Every finding code, in the order of the topics that declare them (:func:`rlparity.diagnose.topic.topics`).

    Returns
    -------
    dict of str to FindingCode
        ``{code: FindingCode}``.
    """
    return {c.code: c for t in topics() for c in t.codes}


def lookup(code: str) -> FindingCode:
    """The catalogue entry of ``code``.

    Parameters
    ----------
    code : str
        A finding code.

    Returns
    -------
    FindingCode
        Its entry.

    Raises
    ------
    KeyError
        If there is no such code; the message names the closest codes.
    """
    cat = catalogue()
    if code in cat:
        return cat[code]
    import difflib

    close = difflib.get_close_matches(code, list(cat), n=3, cutoff=0.5)
    raise KeyError(f"no finding code {code!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                   f"; {len(cat)} codes: `rlparity findings` lists them"))


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_value(x) for x in v) + ")"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_value(x)}" for k, x in v.items())
    return str(v)


def _md(text: str) -> str:
    """Text safe in a Markdown table cell and in prose (no stray table bars)."""
    return text.replace("|", "\\|")


def catalogue_markdown() -> str:
    """The book's catalogue page (MyST Markdown).

    A table of every code, then one section per layer and code with its anchor
    (:func:`rlparity.diagnose.findings.catalogue_anchor`): severities, emitting module, meaning,
    rule, thresholds with their current values, what they were calibrated on, the causes it can
    name and the fix.

    Returns
    -------
    str
        The page's Markdown.
    """
    from rlparity.diagnose.causes import CAUSES

    cat = catalogue()
    by_layer: dict[Layer, list[FindingCode]] = {}
    for c in cat.values():
        by_layer.setdefault(c.layer, []).append(c)
    out = ["# Findings catalogue\n",
           f"Every finding code the diagnoses can emit ({len(cat)} codes), generated from the code "
           "(`rlparity.diagnose.catalogue`): the layer, the severities it can have, what it means, the rule and the "
           "thresholds it reads with their current values and what they were calibrated on, and the fix. A report "
           "links each finding here; in a terminal, `rlparity findings CODE` prints the same entry.\n",
           "The severities are the check's own. The attribution (`rlparity.diagnose.attribution`) turns a warning or "
           "an error that another cause explains into information, naming that cause (`explained_by`).\n",
           "| code | layer | severity | meaning |", "|---|---|---|---|"]
    for c in cat.values():
        first = c.meaning.split(". ")[0].rstrip(".") + "."
        out.append(f"| [`{c.code}`](#{c.anchor}) | {c.layer.value} | {', '.join(s.value for s in c.severities)} "
                   f"| {_md(first)} |")
    out.append("")
    for layer, codes in by_layer.items():
        out.append(f"## {layer.value.replace('_', ' ').capitalize()} layer\n")
        for c in codes:
            out += [f"({c.anchor})=", f"### `{c.code}`\n",
                    f"**{', '.join(s.value for s in c.severities)}** · emitted by `{c.module}`"
                    + (" over the arms of a store" if c.across_arms else " per arm") + "\n",
                    _md(c.meaning) + "\n"]
            if c.rule:
                out.append(f"**Rule.** {_md(c.rule)}\n")
            for t in thresholds(c):
                desc = f": {_md(t['description'])}" if t["description"] else ""
                out.append(f"- `{t['where']}` = `{_value(t['value'])}`{desc}")
            if c.thresholds:
                out.append("")
            out.append(f"**Calibrated on.** {_md(c.calibrated_on)}\n")
            if c.causes:
                out.append("**Causes it can name.** " + "; ".join(
                    f"`{k}` ({_md(CAUSES[k].title)})" for k in c.causes) + "\n")
            out.append(f"**Fix.** {_md(c.fix)}\n")
    return "\n".join(out)


def catalogue_text(code: str | None = None) -> str:
    """Plain text of the catalogue for a terminal.

    Parameters
    ----------
    code : str, optional
        A finding code; None lists every code.

    Returns
    -------
    str
        One line per code (code, layer, severities, first sentence of the meaning), or the full
        entry of ``code``.

    Raises
    ------
    KeyError
        If ``code`` is not a finding code (:func:`lookup`).
    """
    if code is None:
        cat = catalogue()
        width = max(len(c) for c in cat)
        return "\n".join(f"{c.code:<{width}}  {c.layer.value:<14}  {'/'.join(s.value for s in c.severities):<13}  "
                         + c.meaning.split(". ")[0].rstrip(".") for c in cat.values())
    c = lookup(code)
    lines = [f"{c.code} ({c.layer.value}; {', '.join(s.value for s in c.severities)}; {c.module})", "",
             c.meaning, ""]
    if c.rule:
        lines += [f"rule: {c.rule}"]
    for t in thresholds(c):
        lines.append(f"  {t['where']} = {_value(t['value'])}" + (f": {t['description']}" if t["description"] else ""))
    lines += [f"calibrated on: {c.calibrated_on}"]
    if c.causes:
        lines += [f"causes: {', '.join(c.causes)}"]
    lines += [f"fix: {c.fix}"]
    return "\n".join(lines)


__all__ = ["FindingCode", "catalogue", "catalogue_markdown", "catalogue_text", "lookup", "thresholds"]
