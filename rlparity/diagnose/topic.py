"""The topic protocol: one home per diagnosis.

A topic is one module of :mod:`rlparity.diagnose` (the semantic reading, the effective temperature,
the inference path's settings, the LM head's precision, MoE routing, inflight updates, weight sync,
the per-layer localisation, the trainer's determinism, the objective) that declares everything the
package needs to know about it in one object, ``TOPIC = Topic(...)``:

* ``codes``: its finding codes (:class:`FindingCode`: layer, severities, meaning, rule, the
  thresholds it reads and what they were calibrated on, the fix, the causes it can claim);
* ``trace_findings(trace, options, prior, *, evidence)`` and ``arms_findings(arms, options)``: its
  checks on one arm (``prior``: the findings of the topics before it, on that arm) and across arms;
* ``order``: its place in the method (the backend before the objective; a topic may read the
  findings of the topics before it).

:func:`topics` collects every module of the package that has a ``TOPIC``, in order; the
diagnosis (:func:`rlparity.diagnose.diagnose`), the catalogue (:mod:`rlparity.diagnose.catalogue`,
``rlparity findings``, the book's page) and the tests read them from there. Adding a diagnosis is
one module with its ``TOPIC``, its test and its notebook.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlparity.config.defaults import defaults
from rlparity.diagnose.findings import Finding, Layer, Severity, catalogue_anchor

I, W, E = Severity.INFO, Severity.WARNING, Severity.ERROR
SEM, PATH, OBJ = Layer.SEMANTIC, Layer.INFERENCE_PATH, Layer.OBJECTIVE

# what a threshold was calibrated on, in the words of the defaults' descriptions (rlparity.config.defaults)
CPU_TINY = "CPU float32, the tiny model"
H200_BF16 = "H200 bf16 (vLLM 0.26), the small model"
LITERATURE = "conventions from the literature and the peers' docs (verl, GSPO), not calibrated on rlparity captures"
NOT_RECORDED = "not recorded in the code"
NO_THRESHOLD = "no threshold: the check is exact"
FIX_NONE = "nothing to fix: information"
FIX_SETTING = ("keep the reference profile's value; the finding names it as LLM(...) keyword arguments and "
               "`vllm serve` flags (rlparity.diagnose.path.setting_fix)")
LOCALIZED = ("mean |r| of the tokens the cause explains against the background of tokens no cause explains "
             "(r: the residual once the semantic cause is corrected): measured when at least `stale_ratio` times "
             "the background, or above it by `tol_trainer` nats and 4 standard errors; small when the excess is "
             "below `tol_trainer` with 97.5% confidence (ArmEvidence.localized_test)")


@dataclass(frozen=True)
class FindingCode:
    """One finding code: where it comes from, what it means, how it is decided and how to fix it.

    Parameters
    ----------
    code : str
        The finding's name (``Finding.name``).
    layer : Layer
        The layer that emits it.
    severities : tuple of Severity
        The severities the check itself gives it; the attribution may turn a warning or an error
        that another cause explains into information (``Finding.explained_by``).
    meaning : str
        What the finding means, in prose.
    fix : str
        The fix in the user's terms (the check's own constant where it has one).
    module : str
        The module that emits it (``"rlparity.diagnose.semantic"``).
    rule : str, default ""
        The rule that decides it.
    thresholds : tuple of str, default ()
        What the rule reads: a field of :func:`rlparity.config.defaults` (``"tol"``,
        ``"objective.ess_min"``) or a module constant (``"rlparity.diagnose.trainer:FLOOR_SHARE"``).
    calibrated_on : str, default NO_THRESHOLD
        What the thresholds were calibrated on (device, dtype, model), or why there is nothing to
        calibrate.
    causes : tuple of str, default ()
        The keys of :data:`rlparity.diagnose.causes.CAUSES` the finding can claim.
    across_arms : bool, default False
        True when it is emitted over the arms of a store rather than per arm.
    """

    code: str
    layer: Layer
    severities: tuple[Severity, ...]
    meaning: str
    fix: str
    module: str
    rule: str = ""
    thresholds: tuple[str, ...] = ()
    calibrated_on: str = NO_THRESHOLD
    causes: tuple[str, ...] = ()
    across_arms: bool = False

    @property
    def anchor(self) -> str:
        """The code's anchor on the book's catalogue page.

        Returns
        -------
        str
            The anchor (:func:`rlparity.diagnose.findings.catalogue_anchor`).
        """
        return catalogue_anchor(self.code)

    def to_dict(self) -> dict[str, Any]:
        """The entry as plain data, with its thresholds' current values.

        Returns
        -------
        dict
            ``code``, ``layer``, ``severities``, ``meaning``, ``rule``, ``thresholds``
            (:func:`thresholds`), ``calibrated_on``, ``fix``, ``causes``, ``module``, ``across_arms``
            and ``anchor``.
        """
        return {"code": self.code, "layer": self.layer.value, "severities": [s.value for s in self.severities],
                "meaning": self.meaning, "rule": self.rule, "thresholds": thresholds(self),
                "calibrated_on": self.calibrated_on, "fix": self.fix, "causes": list(self.causes),
                "module": self.module, "across_arms": self.across_arms, "anchor": self.anchor}


def _c(code, layer, sev, meaning, fix, module, **kw) -> FindingCode:
    return FindingCode(code, layer, tuple(sev), meaning, fix, f"rlparity.diagnose.{module}", **kw)


def _threshold(ref: str) -> dict[str, Any]:
    if ":" in ref:
        module, name = ref.split(":")
        return {"name": name, "value": getattr(importlib.import_module(module), name), "where": ref,
                "description": ""}
    obj, model = defaults(), None
    for part in ref.split("."):
        model, obj = obj, getattr(obj, part)
    field = type(model).model_fields[ref.split(".")[-1]]
    return {"name": ref, "value": obj, "where": f"defaults().{ref}", "description": field.description or ""}


def thresholds(entry: FindingCode) -> list[dict[str, Any]]:
    """What ``entry``'s rule reads, as the code holds it now.

    Defaults changed with :func:`rlparity.config.defaults_context` show here.

    Parameters
    ----------
    entry : FindingCode
        A catalogue entry.

    Returns
    -------
    list of dict
        One ``{name, value, where, description}`` per threshold of the entry.
    """
    return [_threshold(t) for t in entry.thresholds]



def code(code: str, layer: Layer, sev: Sequence[Severity], meaning: str, fix: str, module: str,
         **kw: Any) -> FindingCode:
    """A catalogue entry (:class:`FindingCode`) of the topic module ``rlparity.diagnose.<module>``.

    Parameters
    ----------
    code : str
        The finding's name.
    layer : Layer
        The layer that emits it.
    sev : sequence of Severity
        The severities the check gives it.
    meaning : str
        What it means.
    fix : str
        The fix in the user's terms.
    module : str
        The topic module's last name part (``"semantic"``).
    **kw
        The other fields of :class:`FindingCode` (``rule``, ``thresholds``, ``calibrated_on``,
        ``causes``, ``across_arms``).

    Returns
    -------
    FindingCode
    """
    return FindingCode(code, layer, tuple(sev), meaning, fix, f"rlparity.diagnose.{module}", **kw)


def no_arms_findings(arms: Mapping[str, Any], options: Any = None) -> list[Finding]:
    """A topic without a check across arms.

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        The arms (left alone).
    options : DiagnoseOptions, optional
        Left alone.

    Returns
    -------
    list of Finding
        ``[]``.
    """
    return []


@dataclass(frozen=True)
class Topic:
    """One diagnosis topic: its finding codes and its checks.

    Parameters
    ----------
    name : str
        The topic's name (its module's last part).
    order : int
        Its place in the method: topics run in increasing order, and each sees the findings of
        those before it on the same arm (the semantic layer first, the objective last). A report
        lists its findings by section, the tens of the order (the semantic topics 10-19 are one
        section), arms within a section and topics within an arm.
    codes : tuple of FindingCode
        Every finding code its checks emit.
    trace_findings : callable
        ``(trace, options, prior, *, evidence) -> list[Finding]``: the checks on one arm.
    arms_findings : callable, default no_arms_findings
        ``(arms, options) -> list[Finding]``: the checks across the arms of one store.
    """

    name: str
    order: int
    codes: tuple[FindingCode, ...]
    trace_findings: Callable[..., list[Finding]]
    arms_findings: Callable[..., list[Finding]] = no_arms_findings


@functools.cache
def topics() -> tuple[Topic, ...]:
    """Every topic of :mod:`rlparity.diagnose` (each module with a ``TOPIC``), in order.

    Returns
    -------
    tuple of Topic
        Sorted by ``order``.

    Raises
    ------
    ValueError
        If two topics share an order or a finding code (the catalogue would be ambiguous).
    """
    found = []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):  # the modules beside this one
        topic = getattr(importlib.import_module(f"{__package__}.{info.name}"), "TOPIC", None)
        if isinstance(topic, Topic):
            found.append(topic)
    found.sort(key=lambda t: t.order)
    orders = [t.order for t in found]
    if len(set(orders)) != len(orders):
        raise ValueError(f"two diagnosis topics share an order: {[(t.name, t.order) for t in found]}; give each "
                         "TOPIC its own order")
    codes = [c.code for t in found for c in t.codes]
    if len(set(codes)) != len(codes):
        dup = sorted({c for c in codes if codes.count(c) > 1})
        raise ValueError(f"finding codes declared by two topics: {dup}; declare each code in one topic's CODES")
    return tuple(found)


__all__ = ["CPU_TINY", "FIX_NONE", "FIX_SETTING", "FindingCode", "H200_BF16", "LITERATURE", "LOCALIZED",
           "NOT_RECORDED", "NO_THRESHOLD", "Topic", "code", "no_arms_findings", "thresholds", "topics"]
