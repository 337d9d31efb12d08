"""Where the two sides part (inference-path layer): the first layer and module at which the
engine's states leave their floor, from an arm's layer profile (:mod:`rlparity.trace.layers`,
measured by :func:`rlparity.experiments.layers.profile_arm` / ``rlparity layers``).

:func:`divergence_start` reads the profile (per site, the relative error pooled over the probe's
tokens, against the floor a clean parity capture reaches there:
:func:`rlparity.metrics.layers.first_divergence`) and names the cause of the catalogue the place identifies:

* the start is ``lm_head`` (every state before it within its floor): the head's precision, on the
  side whose head dtype has fewer bits (``rollout_bf16_head`` / ``trainer_bf16_head``);
* the start is the first attention and only sequences whose prefill hit the prefix cache
  diverge (their cached positions were not recomputed; the positions after them read the cached
  K/V): ``stale_prefix_cache``;
* the start is the first attention on every sequence while position 0 (a token that attends only
  to itself, so no attention kernel mixes anything there) stays within the floor: the attention
  kernels differ (``batch_variant_attention``, another attention backend);
* the start is any other decoder module (or position 0 diverges too): that module's weights
  differ; named ``partial_weight_sync`` when the engine loaded weights after it started (and
  confirmed by an ``engine_weights_differ`` finding naming that layer, when fingerprints exist),
  ``weights_differ`` otherwise. The evidence lists the checkpoint tensors of that module.

A profile whose every site stays within its floor gives ``layers_within_floor`` (information,
with the largest ratio to the floor): the proof that the two sides agree layer by layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.head_precision import _BITS, FIX_ROLLOUT_FP32, FIX_TRAINER_FP32
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.diagnose.sync import FIX_ENGINE
from rlparity.metrics.head_precision import cell_dtypes
from rlparity.metrics.layers import first_divergence, relative_error, within_floor
from rlparity.trace import arm_record
from rlparity.trace.layers import has_layers, site_tensors
from rlparity.diagnose.topic import CPU_TINY, E, FIX_NONE, FindingCode, I, NOT_RECORDED, PATH, Topic, W, code

FIX_PROFILE = ("record the profile again (`rlparity layers run`, or capture with the layer hooks on) on prompts that "
               "produce response tokens; check the hooks saw the engine's states (no NaN everywhere)")
FIX_KERNEL = ("run the engine with the attention backend (and kernels) the reference runs, or with batch-invariant "
              "kernels (VLLM_BATCH_INVARIANT=1 on a GPU); or accept the kernel's rounding as the floor")
FIX_STALE = ("reset the prefix cache at every weight update (pause_generation(clear_cache=True) or "
             "reset_prefix_cache()), or version it with a cache_salt per policy version")
FIX_WEIGHTS_UNKNOWN = ("load the same checkpoint on both sides; `rlparity verify-weights` names the tensors that "
                       "differ")


def _updated(trace: xr.Dataset) -> bool:
    """Whether the engine loaded weights after it started (an update path that can be partial)."""
    rec = arm_record(trace)
    return bool(rec.weight_updates or len(rec.engine_weight_checksums or {}) > 1 or rec.latest_policy_version)


def _head_sides(trace: xr.Dataset, info: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the engine's head dtype, the reference's): the trainer's, or the reference engine's."""
    dt = cell_dtypes(trace)
    if info.get("comparison") == "engine":
        return dt["rollout_head"], info.get("reference_head_dtype")
    return dt["rollout_head"], info.get("trainer_head_dtype") or dt["trainer_head"]


def _cause(trace: xr.Dataset, first: dict[str, Any], prior) -> tuple[str | None, str, str]:
    """``(cause, why, fix)`` for a divergence that starts at ``first``."""
    info = arm_record(trace).layer_capture or {}
    module, layer = first["module"], first["layer"]
    diverging = [q for q in first["sequences"] if q["diverges"]]
    if module == "lm_head":
        eng, ref = _head_sides(trace, info)
        if eng and ref and eng != ref:
            low_engine = _BITS.get(eng, 0) < _BITS.get(ref, 0)
            side = "rollout" if low_engine else ("trainer" if info.get("comparison") != "engine" else "reference engine")
            return (("rollout_bf16_head" if low_engine else "trainer_bf16_head"),
                    f"the {side} head projects in {eng if low_engine else ref} (the other side in "
                    f"{ref if low_engine else eng}), and every state before the head stays within its floor",
                    FIX_ROLLOUT_FP32 if low_engine else FIX_TRAINER_FP32)
        return None, ("every state before the head stays within its floor: the head's weights or its kernel differ "
                      f"(head dtypes: engine {eng}, reference {ref})"), FIX_WEIGHTS_UNKNOWN
    if module == "attention" and layer == 0 and diverging and all(q["cached"] > 0 for q in diverging):
        cached = sorted({q["cached"] for q in diverging})
        return ("stale_prefix_cache",
                f"only sequences whose prefill hit the prefix cache diverge ({len(diverging)} of "
                f"{len(first['sequences'])}; positions 0-{cached[0] - 1} and beyond came from the cache, not recomputed), "
                "from the first attention on, where the positions after them read the cached K/V", FIX_STALE)
    if module == "attention" and layer == 0 and first["position_0_computed"] and not first["position_0_over"]:
        return ("batch_variant_attention",
                "it starts in the first attention, on every position that attends to others, while position 0 (which "
                "attends only to itself: no kernel mixes anything there) stays within its floor: the attention "
                "kernels differ", FIX_KERNEL)
    tensors = site_tensors(layer, module)
    named = [f for f in prior if f.name == "engine_weights_differ"
             and (layer in (f.evidence.get("layers") or []) or set(tensors) & set(f.evidence.get("tensors") or []))]
    where = f"layer {layer} {module}" if layer >= 0 else module
    if named:
        listed = named[0].evidence.get("tensors") or []
        own = [t for t in tensors if t in listed] or listed[:4]
        return ("partial_weight_sync", f"the weights of {where} differ: the engine's fingerprints name "
                f"{', '.join(own)}", FIX_ENGINE)
    if _updated(trace):
        return ("partial_weight_sync", f"every state before {where} is within its floor and {where} is not: its "
                f"weights ({', '.join(tensors) or 'none of its own'}) differ, after a weight update (one layer left "
                "out of the sync)", FIX_ENGINE)
    return ("weights_differ", f"every state before {where} is within its floor and {where} is not: its weights "
            f"({', '.join(tensors) or 'none of its own'}) differ on the two sides", FIX_WEIGHTS_UNKNOWN)


def divergence_start(trace: xr.Dataset, *, floor_ratio: float | None = None, prior=()) -> Finding | None:
    """Where the engine's states first leave their floor, for one arm with a layer profile.

    See the module docstring for the causes each place names.

    Parameters
    ----------
    trace : xarray.Dataset
        An arm with a layer profile (:mod:`rlparity.trace.layers`).
    floor_ratio : float, optional
        A site leaves its floor above this many times the floor; None:
        ``defaults().layer_floor_ratio``.
    prior : sequence of Finding, default ()
        The arm's earlier findings; an ``engine_weights_differ`` naming the diverging layer
        confirms a partial sync.

    Returns
    -------
    Finding or None
        ``divergence_starts_at`` (an error for weights or a stale cache, a warning for precision
        or kernels), ``layers_within_floor`` (info), or ``layers_not_judged`` (a warning: the
        profile holds no sequence, or no finite difference at any site, so nothing can be
        concluded); ``None`` without a layer profile.
    """
    if not has_layers(trace):
        return None
    rec = arm_record(trace)
    info, arm = rec.layer_capture or {}, rec.arm
    vs = "the trainer" if info.get("comparison", "trainer") == "trainer" else \
        f"the engine of {info.get('reference', 'the reference arm')}"
    fr = defaults().layer_floor_ratio if floor_ratio is None else float(floor_ratio)
    common = {"comparison": vs, "path": info.get("path", "eager"), "probe": info.get("probe", ""),
              "floor_ratio": fr, "n_sequences": int(trace.sizes.get("layer_sequence", 0))}
    n_finite = int(np.isfinite(relative_error(trace).values).sum()) if common["n_sequences"] else 0
    if n_finite == 0:  # nothing measured: no verdict, neither "within" nor "diverges"
        return Finding(Layer.INFERENCE_PATH, "layers_not_judged", Severity.WARNING,
                       f"the layer profile against {vs} holds {common['n_sequences']} sequence(s) and no finite "
                       "difference at any site: nothing can be concluded about where the states diverge",
                       {**common, "n_finite_sites": 0}, FIX_PROFILE, arm)
    first = first_divergence(trace, floor_ratio=fr)
    if first is None:
        w = within_floor(trace, floor_ratio=fr)
        return Finding(Layer.INFERENCE_PATH, "layers_within_floor", Severity.INFO,
                       f"every layer and module stays within its floor against {vs} (largest ratio to the floor "
                       f"{w['max_ratio_to_floor']:.3g}x at {w['at_site']}; largest relative error "
                       f"{w['max_relative_error']:.3g})", {**common, **w},
                       "", arm)
    cause, why, fix = _cause(trace, first, prior)
    diverging = [q for q in first["sequences"] if q["diverges"]]
    firsts = [q["first_position"] for q in diverging if q["first_position"] is not None]
    ev = {**common, "site": first["site"], "layer": first["layer"], "module": first["module"],
          "relative_error": first["relative_error"], "floor": first["floor"], "threshold": first["threshold"],
          "ratio_to_floor": first["ratio_to_floor"], "max_ratio_to_floor_before": first["max_ratio_before"],
          "max_relative_error_before": first["max_relative_error_before"],
          "n_sequences_diverging": len(diverging),
          "first_position": min(firsts) if firsts else None,
          "cached_positions": [q["cached"] for q in first["sequences"]],
          "position_0_over": first["position_0_over"]}
    if first["module"] not in ("output",):
        ev["tensors"] = site_tensors(first["layer"], first["module"])
    sev = Severity.ERROR if cause in ("partial_weight_sync", "stale_prefix_cache", "weights_differ") else Severity.WARNING
    ratio = first["ratio_to_floor"]
    size = (f"{first['relative_error']:.3g}, {ratio:.3g}x its floor" if np.isfinite(ratio)
            else f"{first['relative_error']:.3g}, over {first['threshold']:.3g}")
    return Finding(Layer.INFERENCE_PATH, "divergence_starts_at", sev,
                   f"against {vs}, the engine's states first leave their floor at {first['site']} (relative error "
                   f"{size}): {why}", ev, fix, arm, cause=cause)


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=(),
                   evidence=None) -> list[Finding]:
    """The per-layer check of one arm (called by :func:`rlparity.diagnose.diagnose`).

    Parameters
    ----------
    trace : xarray.Dataset
        An arm.
    options : DiagnoseOptions, optional
        Reads ``layer_floor_ratio``; None: the defaults.
    prior : sequence of Finding, default ()
        The earlier layers' findings for the arm (the weight-sync findings confirm a partial sync).
    evidence : ArmEvidence, optional
        The arm's evidence (unused here).

    Returns
    -------
    list of Finding
        :func:`divergence_start`'s finding, or empty.
    """
    opts = options or DiagnoseOptions()
    f = divergence_start(trace, floor_ratio=opts.layer_floor_ratio, prior=prior)
    return [f] if f is not None else []


# the finding codes this topic emits (collected by rlparity.diagnose.catalogue)
CODES: tuple[FindingCode, ...] = (
    code("divergence_starts_at", PATH, (W, E),
           "From a per-layer profile: the first layer and module at which the engine's states leave their floor, and the "
           "cause that place identifies (the LM head's precision, a stale prefix cache, other attention kernels, or one "
           "module's weights). An error for weights or a stale cache, a warning for precision or kernels.",
           "the fix of the cause it names: " + FIX_STALE + "; " + FIX_KERNEL + "; "
           + FIX_WEIGHTS_UNKNOWN, "layers",
           rule="a site leaves its floor when its relative error exceeds `layer_floor_ratio` times the clean arm's there "
                "and `layer_min_rel`", thresholds=("layer_floor_ratio", "layer_min_rel"),
           calibrated_on=CPU_TINY + " (eager): clean arms on other prompts stay within 2x",
           causes=("rollout_bf16_head", "trainer_bf16_head", "stale_prefix_cache", "batch_variant_attention",
                   "partial_weight_sync", "weights_differ")),
    code("layers_not_judged", PATH, (W,),
           "The layer profile holds no sequence, or no finite difference at any site: nothing can be concluded about "
           "where the states diverge (neither within the floor nor diverging).", FIX_PROFILE, "layers",
           rule="no finite relative error at any site of the profile (or zero layer sequences)",
           calibrated_on=NOT_RECORDED),
    code("layers_within_floor", PATH, (I,),
           "Every layer and module stays within its floor: the two sides agree layer by layer (with the largest ratio "
           "to the floor).", FIX_NONE, "layers", thresholds=("layer_floor_ratio", "layer_min_rel"),
           calibrated_on=CPU_TINY + " (eager)"),
)

TOPIC = Topic('layers', 70, CODES, trace_findings)

__all__ = ["divergence_start", "trace_findings"]
