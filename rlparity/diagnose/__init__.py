"""Diagnoses: turn traces into findings with verdicts (layer, severity, evidence, fix).

``diagnose(trace)`` runs every per-trace check of every layer module and returns a
:class:`Report`. A layer module (``semantic``, ``path``, ``head``) contributes

* ``trace_findings(trace) -> list[Finding]``: checks on one arm, and optionally
* ``arms_findings(arms, reference) -> list[Finding]``: checks that compare arms of one store.
"""

from __future__ import annotations

import importlib
from typing import Any

import xarray as xr

from rlparity.diagnose.findings import Finding, Layer, Report, Severity

# in layer order: semantic before the inference path, the LM head last
LAYER_MODULES = ("semantic", "path", "head")


def _modules():
    for name in LAYER_MODULES:
        try:
            yield importlib.import_module(f"rlparity.diagnose.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"rlparity.diagnose.{name}":
                raise


def diagnose(data: Any, *, reference: str | None = None, title: str = "rlparity findings",
             **options: Any) -> Report:
    """Run every check on ``data`` (one trace, ``{arm: trace}``, a DataTree or a zarr path).

    ``reference`` names the arm other arms are compared with (inference-path checks); keyword
    ``options`` are passed to the checks that accept them (e.g. ``tol=0.02``).
    """
    import inspect

    from rlparity.trace import as_arms

    arms = {name: ds if ds.attrs.get("arm") == name else ds.assign_attrs(arm=name)
            for name, ds in as_arms(data).items()}
    report = Report(title=title, context={"arms": list(arms), "reference": reference})
    for mod in _modules():
        fn = getattr(mod, "trace_findings", None)
        if fn is not None:
            accepted = {k: v for k, v in options.items() if k in inspect.signature(fn).parameters}
            for ds in arms.values():
                report.extend(fn(ds, **accepted))
        fn = getattr(mod, "arms_findings", None)
        if fn is not None and len(arms) > 1:
            report.extend(fn(arms, reference))
    return report


__all__ = ["Finding", "Layer", "Report", "Severity", "diagnose"]
