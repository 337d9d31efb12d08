"""Findings: what every diagnosis returns.

A :class:`Finding` names the layer that is wrong (semantic / inference path / objective), how
bad it is, the evidence (numbers, with the pair and direction they were computed on) and the
fix in the user's terms; it prints well in a terminal (``str``) and renders in a notebook
(``_repr_html_``, its code linked to the findings catalogue). A list of findings with a verdict is a
:class:`~rlparity.diagnose.report.Report` (:mod:`rlparity.diagnose.report`).
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

# where a rendered report links each finding code: the book's catalogue page, relative to a chapter
# (book/notebooks/NN.html -> book/reference/findings.html); ``Report.to_html(catalogue=...)`` takes another
CATALOGUE_URL = "../reference/findings.html"


def catalogue_anchor(code: str) -> str:
    """The anchor of a finding code on the catalogue page.

    Parameters
    ----------
    code : str
        A finding code.

    Returns
    -------
    str
        A Sphinx label: ``"finding-"`` plus the code in lower case with ``-`` for ``_``.
    """
    return "finding-" + code.lower().replace("_", "-")


def catalogue_link(code: str, catalogue: str | None = CATALOGUE_URL) -> str:
    """A finding code linked to its catalogue entry, as HTML.

    Parameters
    ----------
    code : str
        A finding code.
    catalogue : str or None, default CATALOGUE_URL
        The catalogue page's URL (the book's, relative to a chapter); None: no link.

    Returns
    -------
    str
        ``<a href=CATALOGUE#anchor><code>code</code></a>``, or the ``<code>`` alone without a
        catalogue.
    """
    text = f"<code>{html.escape(code)}</code>"
    if not catalogue:
        return text
    return (f"<a href='{html.escape(catalogue)}#{catalogue_anchor(code)}' "
            f"title='what {html.escape(code)} means and how to fix it'>{text}</a>")


class Layer(str, Enum):
    """The layer a finding belongs to, in the order to fix them.

    Attributes
    ----------
    SEMANTIC : str
        ``"semantic"``: which distribution each side's logprobs describe.
    INFERENCE_PATH : str
        ``"inference_path"``: the numerics and state of the engine and the trainer (settings, LM
        head, routing, weight updates and syncs, kernels).
    OBJECTIVE : str
        ``"objective"``: the importance ratios, corrections and clipping the update uses.
    """
    SEMANTIC = "semantic"
    INFERENCE_PATH = "inference_path"
    OBJECTIVE = "objective"


class Severity(str, Enum):
    """How bad a finding is.

    Attributes
    ----------
    INFO : str
        ``"info"``: information or an all-clear.
    WARNING : str
        ``"warning"``: look at it.
    ERROR : str
        ``"error"``: parity is broken; fix it.
    """
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """The severity as a number, for comparisons.

        Returns
        -------
        int
            0 for info, 1 for warning, 2 for error.
        """
        return {"info": 0, "warning": 1, "error": 2}[self.value]


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem (or an explicit all-clear with severity ``info``).

    The attribution fields (``cause``, ``tokens``, ``share``, ``explained_by``) are filled by
    :func:`rlparity.diagnose.attribution.attribute` for the findings of an arm.

    Parameters
    ----------
    layer : Layer
        The layer that is wrong.
    name : str
        The finding code (its entry in :mod:`rlparity.diagnose.catalogue`).
    severity : Severity
        How bad it is.
    summary : str
        One sentence saying what was found.
    evidence : dict, optional
        The numbers, with the pair and direction they were computed on (logprob quantities in
        nats).
    fix : str, default ""
        The fix in the user's terms.
    arm : str or None, default None
        The arm it is about; None for a finding over all arms.
    cause : str or None, default None
        The cause it claims (a key of :data:`rlparity.diagnose.causes.CAUSES`), ``None`` for
        information and all-clears.
    tokens : dict or None, default None
        Which tokens it explains, ``{"scope", "n_tokens", "n_sequences"}``.
    share : float or None, default None
        The share of the arm's measured excess mismatch (over the floor) it accounts for.
    explained_by : str or None, default None
        The cause that explains a verdict demoted to information.
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
        """The finding as plain data (enums as their values).

        Returns
        -------
        dict
            Every field.
        """
        d = asdict(self)
        d["layer"] = self.layer.value
        d["severity"] = self.severity.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        """A finding from :meth:`to_dict`'s output.

        Parameters
        ----------
        d : dict
            Every field, ``layer`` and ``severity`` as their values.

        Returns
        -------
        Finding
            The finding.
        """
        return cls(**{**d, "layer": Layer(d["layer"]), "severity": Severity(d["severity"])})

    def with_(self, **changes: Any) -> Finding:
        """A copy with some fields changed.

        Parameters
        ----------
        **changes
            New values of fields.

        Returns
        -------
        Finding
            The copy (the finding is frozen).
        """
        return replace(self, **changes)

    @property
    def attribution(self) -> str:
        """The attribution in words.

        Returns
        -------
        str
            ``"explains 83% of the excess mismatch on 512 tokens (...)"``, ``"explained by X"``, a
            floor cause's share of mean ``|d|``, a note for tokens with pi_old = 0, or ``""`` without
            an attribution.
        """
        if self.explained_by:
            return f"explained by {self.explained_by}"
        if self.share is None:
            return ""
        where = f" on {self.tokens['n_tokens']} tokens ({self.tokens.get('scope', '')})" if self.tokens else ""
        if self.evidence.get("outside_abs_d_sum") and not self.share:
            n = self.tokens.get("n_tokens") if self.tokens else None
            return (f"{n if n is not None else 'its'} tokens with pi_old = 0: infinite |d|, outside the mean |d| "
                    "the shares divide")
        floor = self.evidence.get("floor_share_of_mean_abs_d")
        if floor is not None and not self.share:  # a floor cause: the excess is measured above it
            return f"the floor: {floor:.0%} of mean |d|{where}; the excess mismatch is measured above it"
        return f"explains {self.share:.0%} of the excess mismatch{where}"

    def to_html(self, *, catalogue: str | None = CATALOGUE_URL) -> str:
        """One finding as a notebook shows it.

        Severity, the code linked to its catalogue entry, the summary, the fix at full width and the
        evidence folded away in a small table.

        Parameters
        ----------
        catalogue : str or None, default CATALOGUE_URL
            The catalogue page's URL; None: no link.

        Returns
        -------
        str
            An HTML fragment.
        """
        sev = self.severity.value
        att = f" <small>({html.escape(self.attribution)})</small>" if self.attribution else ""
        arm = f" (arm {html.escape(self.arm)})" if self.arm else ""
        fix = f"<p><b>fix:</b> {html.escape(self.fix)}</p>" if self.fix else ""
        ev = _evidence_html(self.evidence)
        return (f"<div class='rlparity-finding'><p><b style='color:{_COLORS[sev]}'>{sev}</b> "
                f"{self.layer.value}/{catalogue_link(self.name, catalogue)}{arm}: {html.escape(self.summary)}{att}</p>"
                f"{fix}" + (f"<details><summary>evidence</summary>{ev}</details>" if ev else "") + "</div>")

    def _repr_html_(self) -> str:
        return self.to_html()

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


def _fmt(v: Any, limit: int = 8) -> str:
    """A value as a reader wants it: floats to 6 significant digits, numpy scalars as plain numbers
    (never ``np.float64(...)``), mappings as ``k=v``, sequences cut after ``limit`` items."""
    if type(v).__module__ == "numpy" and hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        v = v.item()
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        items = list(v.items())
        more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
        return ", ".join(f"{k}={_fmt(x, limit)}" for k, x in items[:limit]) + more
    if isinstance(v, (list, tuple)) or (type(v).__module__ == "numpy" and hasattr(v, "tolist")):
        v = list(v.tolist() if hasattr(v, "tolist") else v)
        more = f", ... ({len(v) - limit} more)" if len(v) > limit else ""
        return "[" + ", ".join(_fmt(x, limit) for x in v[:limit]) + more + "]"
    return str(v)


_COLORS = {"error": "#c0392b", "warning": "#d68910", "info": "#2874a6", "ok": "#1e8449"}


def _evidence_html(evidence: dict[str, Any]) -> str:
    """The evidence as a small two-column table (values formatted by :func:`_fmt`)."""
    rows = "".join(f"<tr><td><code>{html.escape(str(k))}</code></td><td>{html.escape(_fmt(v))}</td></tr>"
                   for k, v in evidence.items())
    return f"<table style='font-size:85%'><tbody>{rows}</tbody></table>" if rows else ""

