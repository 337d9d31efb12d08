"""Diagnoses: turn traces into findings with verdicts (layer, severity, evidence, fix).

``diagnose(data, **options)`` runs every check of every layer module, in layer order, and returns
a :class:`Report`. A layer module (:mod:`~rlparity.diagnose.semantic`,
:mod:`~rlparity.diagnose.path`, :mod:`~rlparity.diagnose.head`, :mod:`~rlparity.diagnose.inflight`,
:mod:`~rlparity.diagnose.objective`)
contributes

* ``trace_findings(trace, options, prior) -> list[Finding]``: checks on one arm (``prior``: the
  earlier layers' findings for that arm), and
* ``arms_findings(arms, options) -> list[Finding]``: checks that compare arms of one store.

Both receive the same :class:`DiagnoseOptions`; an unknown option is an error.
"""

from __future__ import annotations

from typing import Any

from rlparity.diagnose import head, inflight, objective, path, semantic
from rlparity.diagnose.findings import Finding, Layer, Report, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.trace import as_arms, validate

# in layer order: the backend (semantic, inference path, LM head) before the objective, which sees
# the backend's findings (a correction must not hide a backend error)
LAYERS = (semantic, path, head, inflight, objective)


def diagnose(data: Any, options: DiagnoseOptions | None = None, *, title: str = "rlparity findings",
             **changes: Any) -> Report:
    """Run every check on ``data`` (one trace, ``{arm: trace}``, a DataTree or a zarr path).

    Options (see :class:`DiagnoseOptions`) are given as an object, as keywords, or both
    (keywords win): e.g. ``diagnose(store, reference="eager", tol_reference=1e-3)``. They reach
    every check; an unknown name is a ``ValueError``.
    """
    opts = DiagnoseOptions.make(options, **changes)
    arms = {name: ds if ds.attrs.get("arm") == name else ds.assign_attrs(arm=name)
            for name, ds in as_arms(data).items()}
    if not arms:
        raise ValueError("no arms to diagnose: pass a trace, {arm: trace} or a store with at least one arm")
    for name, ds in arms.items():  # the judging boundary: scored, with tokens to judge
        validate(ds, require_trainer=True, where=f"arm {name!r}")
    if opts.reference is not None and opts.reference not in arms:
        raise ValueError(f"reference={opts.reference!r} is not an arm of the data; arms: {sorted(arms)}")
    report = Report(title=title, context={"arms": list(arms), "options": opts.model_dump()})
    for layer in LAYERS:
        for name, ds in arms.items():
            report.extend(layer.trace_findings(ds, opts, [f for f in report if f.arm == name]))
        if len(arms) > 1:
            report.extend(layer.arms_findings(arms, opts))
    return report


__all__ = ["DiagnoseOptions", "Finding", "Layer", "Report", "Severity", "diagnose"]
