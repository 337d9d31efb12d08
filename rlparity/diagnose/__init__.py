"""Diagnoses: turn traces into findings with verdicts (layer, severity, evidence, fix).

``diagnose(data, **options)`` runs every check of every topic, in the method's order, and returns
a :class:`Report`. A topic is one module with a ``TOPIC`` (:mod:`rlparity.diagnose.topic`:
:mod:`~rlparity.diagnose.semantic`, :mod:`~rlparity.diagnose.temperature`,
:mod:`~rlparity.diagnose.path`, :mod:`~rlparity.diagnose.head_precision`, :mod:`~rlparity.diagnose.routing`,
:mod:`~rlparity.diagnose.inflight`, :mod:`~rlparity.diagnose.sync`, :mod:`~rlparity.diagnose.layers`,
:mod:`~rlparity.diagnose.trainer`, :mod:`~rlparity.diagnose.objective`, ...) that declares its finding
codes and contributes

* ``trace_findings(trace, options, prior) -> list[Finding]``: checks on one arm (``prior``: the
  earlier topics' findings for that arm), and
* ``arms_findings(arms, options) -> list[Finding]``: checks that compare arms of one store.

Both receive the same :class:`DiagnoseOptions`; an unknown option is an error.
"""

from __future__ import annotations

from typing import Any

from rlparity.diagnose.attribution import attribute
from rlparity.diagnose.causes import CAUSES
from rlparity.diagnose.evidence import build as build_evidence
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.diagnose.report import Report
from rlparity.diagnose.topic import topics
from rlparity.trace import arm_record, as_arms, has_trainer, is_lazy, load_sample, validate

# a lazy arm is judged on at most about this many real tokens (the largest lazy arm sets the stride)
LAZY_SAMPLE_TOKENS = 2_000_000


def _in_memory(arms: dict[str, Any], max_tokens: int, progress: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Lazy arms (``open_arms(store, chunks=N)``) loaded for judging, with bounded memory: the
    detectors need per-token arrays (robust fits, per-token evidence, attribution by token), so an
    arm larger than ``max_tokens`` real tokens is judged on every k-th sequence, the same k (and so
    the same sequences) in every lazy arm; smaller arms are loaded whole and judged exactly as
    eagerly. Every block is read, validated and CRC-checked either way
    (:func:`rlparity.trace.load_sample`). Returns the arms and, per sampled arm, what was kept."""
    lazy = [name for name, ds in arms.items() if is_lazy(ds)]
    if not lazy:
        return arms, {}
    tokens = max(int(arms[name]["response_mask"].sum()) for name in lazy)  # a dask reduction over the mask
    every = max(1, -(-tokens // max(int(max_tokens), 1)))
    loaded = {name: load_sample(ds, every=every, progress=progress) if name in lazy else ds
              for name, ds in arms.items()}
    return loaded, {name: arm_record(loaded[name]).lazy_sample for name in lazy if every > 1}


def diagnose(data: Any, options: DiagnoseOptions | None = None, *, title: str = "rlparity findings",
             lazy_tokens: int = LAZY_SAMPLE_TOKENS, progress: Any = None, **changes: Any) -> Report:
    """Run every check on ``data`` and return the findings as a report.

    Per arm, the evidence is built first (:mod:`rlparity.diagnose.evidence`: which tokens an
    identified cause explains, the semantic reading on the rest, the residual and the floors);
    every layer judges on it, in layer order; then the attribution
    (:mod:`rlparity.diagnose.attribution`) gives each finding at WARNING or above the tokens it
    explains and its share of the measured mismatch, picks the arm's headline (the cause that
    explains the most) and turns verdicts another cause explains into information
    (``Report.attribution[arm]``, ``Report.headline(arm)``).

    Options are given as an object, as keywords, or both (keywords win): e.g.
    ``diagnose(store, reference="eager", tol_reference=1e-3)``. They reach every check.

    Lazy arms (``open_arms(store, chunks=N)``, traces larger than memory) are read block by block
    (validated, CRC-checked) and judged in memory when they hold at most ``lazy_tokens`` real
    tokens (the same verdicts as eagerly); a larger arm is judged on a systematic sample of its
    sequences (every k-th, at most about ``lazy_tokens`` tokens), recorded in
    ``Report.context["lazy_sample"]``: the detectors need per-token arrays, so their statistics are
    the sample's. For whole-trace numbers of a lazy trace use :func:`rlparity.metrics.summary` and
    :func:`rlparity.metrics.as_dashboard`, which stream every token.

    Parameters
    ----------
    data : xarray.Dataset, mapping, xarray.DataTree or str
        One trace, ``{arm: trace}``, a DataTree or a zarr store path; every arm scored by the
        trainer.
    options : DiagnoseOptions, optional
        The options (:class:`DiagnoseOptions`); None: the defaults.
    title : str, default "rlparity findings"
        The report's title.
    lazy_tokens : int, default LAZY_SAMPLE_TOKENS
        The most real tokens a lazy arm is judged on (2,000,000); larger arms are sampled.
    progress : callable, optional
        Wraps the block iterator of lazy arms (e.g. ``tqdm``); None: no progress bar.
    **changes
        Fields of :class:`DiagnoseOptions` given as keywords; they replace those of ``options``.

    Returns
    -------
    Report
        The findings in layer order (arms within), with the attribution per arm and the options
        in its context.

    Raises
    ------
    ValueError
        If there is no arm, an arm is not scored or fails validation, ``reference`` is not an arm,
        or an option is unknown or invalid.
    """
    opts = DiagnoseOptions.make(options, **changes)
    arms = {name: ds if arm_record(ds).arm == name else ds.assign_attrs(arm=name)
            for name, ds in as_arms(data).items()}
    if not arms:
        raise ValueError("no arms to diagnose: pass a trace, {arm: trace} or a store with at least one arm")
    arms, sampled = _in_memory(arms, lazy_tokens, progress)
    for name, ds in arms.items():  # the judging boundary: scored, with tokens to judge
        validate(ds, require_trainer=True, where=f"arm {name!r}")
    if opts.reference is not None and opts.reference not in arms:
        raise ValueError(f"reference={opts.reference!r} is not an arm of the data; arms: {sorted(arms)}")
    report = Report(title=title, context={"arms": list(arms), "options": opts.model_dump(),
                                          **({"lazy_sample": sampled} if sampled else {})})
    evidence = {name: build_evidence(ds, trainer=opts.trainer, semantic_tol=opts.semantic_tol)
                if has_trainer(ds) else None
                for name, ds in arms.items()}
    per_arm: dict[str, list[Finding]] = {name: [] for name in arms}
    section: dict[int, int] = {}  # id(finding) -> the report section of the topic that made it (its order's tens)
    shared: list[Finding] = []
    # the topics in the method's order (topic.topics): the backend (semantic, inference path: settings, LM head,
    # MoE routing, inflight updates, weight sync, the trainer's determinism) before the objective, which sees the
    # backend's findings (a correction must not hide a backend error)
    for topic in topics():
        for name, ds in arms.items():
            new = topic.trace_findings(ds, opts, list(per_arm[name]), evidence=evidence[name])
            section.update((id(f), topic.order // 10) for f in new)
            per_arm[name].extend(new)
        if len(arms) > 1:
            for f in topic.arms_findings(arms, opts):
                section[id(f)] = topic.order // 10
                (per_arm[f.arm] if f.arm in per_arm else shared).append(f)
    found: list[tuple[int, int, Finding]] = []
    for a, name in enumerate(arms):
        section_of = [section[id(f)] for f in per_arm[name]]
        attributed, record = attribute(per_arm[name], evidence[name])
        found += [(k, a, f) for k, f in zip(section_of, attributed)]
        if record:
            report.attribution[name] = record
    found += [(section[id(f)], len(arms), f) for f in shared]
    # the report lists the sections in the order of the method (backend before objective), arms within, the topics of
    # a section in their order (a stable sort: each arm's findings are in topic order)
    report.extend(f for _, _, f in sorted(found, key=lambda t: (t[0], t[1])))
    return report


__all__ = ["CAUSES", "DiagnoseOptions", "Finding", "Layer", "Report", "Severity", "diagnose"]
