"""LM-head precision (inference-path layer): do both sides project to logits in the same precision?

A bfloat16 LM head rounds every logit to 8 significant bits, so the error of a logit grows with its
magnitude; when the rollout engine and the trainer use different head precisions the two sides'
token probabilities disagree on every token (MiniMax-M1 traced its train/inference probability
mismatch to exactly this). The check reads both precisions from the trace attrs, the rollout's as
the running engine reported it (``engine_effective["head_dtype"]``), the trainer's as the scorer
recorded it (``trainer["head_dtype"]``), and gives the measured gap as evidence.

* :func:`head_precision`: one arm; a warning when the two sides differ, information otherwise.
* :func:`head_matrix_finding`: over the arms of a head-dtype matrix
  (:func:`rlparity.experiments.head_precision.head_matrix`, tables in :mod:`rlparity.metrics.head_precision`), whether the matched fp32 cell is the closest.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import xarray as xr

from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.config.defaults import defaults
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.metrics import BACKEND_PAIR_D, core, log_ratio, summary
from rlparity.metrics.head_precision import CELL_DIMS, cell_dtypes, head_table, matched_advantage
from rlparity.trace import arm_factors, arm_record, has_trainer
from rlparity.diagnose.topic import CPU_TINY, FIX_NONE, FindingCode, I, PATH, Topic, W, code

PAIR = BACKEND_PAIR_D
FIX_ROLLOUT_FP32 = ("run the rollout LM head in float32: LLM(..., hf_overrides={'head_dtype': 'float32'}) "
                    "or vllm serve ... --hf-overrides '{\"head_dtype\": \"float32\"}'")
FIX_TRAINER_FP32 = ("compute the trainer's logits in float32: cast the final hidden states and the lm_head "
                    "weight to float32 before the projection (rlparity: Scorer(..., head_dtype='float32'))")
_BITS = {"float32": 24, "float16": 11, "bfloat16": 8}  # significand bits


def _gap_evidence(trace: xr.Dataset, trainer: str | None = None, eps: float | None = None) -> dict:
    s = summary(trace, trainer, eps)
    ev = {"rms_d": float(s["abs_log_ratio_rms"]), "max_abs_d": float(s["abs_log_ratio_max"]),
          "mean_ratio": float(s["mean_ratio"]), "prob_pearson": float(s["prob_pearson"]),
          f"clip_fraction_eps_{s.attrs['eps']:g}": float(s["clip_fraction"]), "n_tokens": int(s["n_tokens"]), "pair": PAIR}
    if "trainer_max_logit" in trace:
        d = log_ratio(trace, trainer).values
        mask = core.finite_mask(d, trace["response_mask"].values.astype(bool))
        x = trace["trainer_max_logit"].values
        mask &= np.isfinite(x)
        if mask.sum() >= 8:
            lo, hi = np.quantile(x[mask], [0.25, 0.75])
            ev["rms_d_lowest_quarter_max_logit"] = core.abs_stats(d, mask & (x <= lo))["rms"]
            ev["rms_d_highest_quarter_max_logit"] = core.abs_stats(d, mask & (x >= hi))["rms"]
    return ev


# causes that move every token on their own: with one of them named, the residual's size says nothing of rounding
_OTHER_GLOBAL = ("sampling_penalty", "trainer_temperature", "trainer_top_k", "trainer_dropout")
# findings that name such a cause from a few tokens at the cut's edge, which a bf16 head itself produces
_LOCAL_SIGNS = ("zero_probability_tokens", "topk_boundary_flips")
FIX_EITHER_FP32 = FIX_ROLLOUT_FP32 + "; and " + FIX_TRAINER_FP32


def rounding_from_numbers(trace: xr.Dataset, evidence=None, prior=()) -> dict:
    """Whether the differences have the size of bfloat16 rounding of the logits (issue 41).

    :func:`rlparity.metrics.head_precision.rounding_scale` on the residual of the tokens no other
    cause explains; ``rounding`` is True when its median ratio is ``defaults().head_rounding_share``
    or more by ``temperature_z`` jackknife errors; with fewer than ``jackknife_groups`` groups (fewer
    sequences) the bar is scaled by the Student-t quantiles of the groups less one over the full
    jackknife's (:func:`rlparity.metrics.head_precision.student_t_level`). Untestable (``testable`` False, with ``why``) without
    the trainer's largest logit and token rank, with a trainer whose own run-to-run noise is a quarter
    of the rounding scale or more (dropout), or when another cause that moves every token is named.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    evidence : ArmEvidence, optional
        Its evidence (the residual); built here when not given.
    prior : sequence of Finding, default ()
        The earlier layers' findings for the arm.

    Returns
    -------
    dict
        ``testable``, ``why``, the statistic (``share``, ``share_se``, ``n_tokens``, ``n_sequences``),
        the threshold and ``rounding``.
    """
    from rlparity.diagnose.evidence import build
    from rlparity.metrics.head_precision import bf16_spacing, rounding_scale, student_t_level

    o = defaults()
    out: dict = {"testable": False, "threshold": o.head_rounding_share, "rounding": False}
    if "trainer_max_logit" not in trace or "trainer_token_rank" not in trace:
        return {**out, "why": "the trace records neither the trainer's largest logit nor its token rank"}
    other = sorted({f.cause for f in prior if f.cause in _OTHER_GLOBAL and f.severity.rank >= 1
                    and f.name not in _LOCAL_SIGNS})
    if other:
        return {**out, "why": f"another cause moves every token ({', '.join(other)})"}
    ev = evidence if evidence is not None else build(trace)
    if ev.residual is None:
        return {**out, "why": "no residual"}
    temp = np.broadcast_to(trace["temperature"].values[:, None], ev.mask.shape) if "temperature" in trace else \
        np.ones(ev.mask.shape)
    use = ev.unclaimed() & np.isfinite(ev.residual)
    scale = bf16_spacing(trace["trainer_max_logit"].values) / np.sqrt(6.0) / np.where(temp > 0, temp, 1.0)
    noise = ev.trainer_floor().get("run_to_run_mean_abs", float("nan"))
    typical = float(np.nanmedian(np.where(use, scale, np.nan))) if use.any() else float("nan")
    if np.isfinite(noise) and np.isfinite(typical) and noise >= 0.25 * typical:
        return {**out, "why": f"the trainer's own run-to-run noise ({noise:.3g} nats) is a quarter of the rounding "
                              f"scale ({typical:.3g}) or more"}
    f = rounding_scale(np.abs(ev.residual), trace["trainer_max_logit"].values, temp, trace["trainer_token_rank"].values,
                       use, groups=o.jackknife_groups)
    if f["n_sequences"] < o.min_fit_sequences or not np.isfinite(f["share_se"]):
        return {**out, **f, "why": f"{f['n_sequences']} sequences with tokens below the argmax (a reading needs "
                                   f"{o.min_fit_sequences})"}
    # temperature_z as calibrated with the full jackknife (jackknife_groups groups); with fewer groups (fewer sequences)
    # the error is less sure: the bar grows as the t law's quantile of the groups less one over the full one's (3 errors
    # at 20 groups are 3 * 5.51 / 3.45 = 4.8 at 6; a reading of 6 sequences cleared 3 errors by chance, issue 41)
    k, full = f["n_groups"], o.jackknife_groups
    level = o.temperature_z if k >= full else \
        o.temperature_z * student_t_level(o.temperature_z, k - 1) / student_t_level(o.temperature_z, full - 1)
    rounding = f["share"] - level * f["share_se"] >= o.head_rounding_share
    return {**out, **f, "testable": True, "why": "", "rounding": bool(rounding), "errors_level": level,
            "reading": "median over non-argmax tokens of |r| / (bf16 spacing of the largest logit / sqrt 6 / T): "
                       "~0.72 for one side's logits rounded to bf16, parity 0.001-0.33 (metrics.head_precision."
                       "rounding_scale)"}


def trainer_head_from_numbers(trace: xr.Dataset) -> dict:
    """Whether the trainer's logits carry bfloat16's 8 significant bits (issue 41).

    :func:`rlparity.metrics.head_precision.quantised_share` of ``trainer_max_logit`` on the response
    tokens; ``bf16`` is True when the share is ``defaults().head_quantised_share`` or more over at
    least ``defaults().min_quantised_tokens`` tokens. Untestable (``testable`` False, with ``why``)
    without the trainer's largest logit or with too few tokens.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.

    Returns
    -------
    dict
        ``testable``, ``why``, ``share``, ``n_tokens``, ``n_bf16``, the ``threshold`` and ``bf16``.
    """
    from rlparity.metrics.head_precision import quantised_share

    o = defaults()
    out: dict = {"testable": False, "threshold": o.head_quantised_share, "bf16": False}
    if "trainer_max_logit" not in trace:
        return {**out, "why": "the trace does not record the trainer's largest logit"}
    mask = trace["response_mask"].values.astype(bool) if "response_mask" in trace else \
        np.ones(trace["trainer_max_logit"].shape, bool)
    q = quantised_share(trace["trainer_max_logit"].values, mask)
    if q["n_tokens"] < o.min_quantised_tokens:
        return {**out, **q, "why": f"{q['n_tokens']} tokens with a trainer_max_logit (a reading needs "
                                   f"{o.min_quantised_tokens})"}
    return {**out, **q, "testable": True, "why": "", "bf16": bool(q["share"] >= o.head_quantised_share)}


def head_precision(trace: xr.Dataset, *, tol: float | None = None, trainer: str | None = None,
                   eps: float | None = None, evidence=None, prior=()) -> Finding | None:
    """Compare the rollout's effective LM-head dtype with the trainer's.

    The evidence is the measured gap: RMS and max ``|d|`` (nats), mean ratio, the Pearson
    correlation of token probabilities, the clip fraction and, when recorded, RMS d in the lowest
    and highest quarter of the trainer's largest logit.

    Parameters
    ----------
    trace : xarray.Dataset
        An arm.
    tol : float, optional
        RMS of d (nats) above which a matched low-precision head still warns; None:
        ``defaults().tol``.
    trainer : str, optional
        The trainer reading; None: the default.
    eps : float, optional
        Clip range of the clip fraction in the evidence; None: ``defaults().eps``.
    evidence : ArmEvidence, optional
        The arm's evidence, for the reading from the numbers (:func:`rounding_from_numbers`).
    prior : sequence of Finding, default ()
        The earlier layers' findings for the arm.

    Returns
    -------
    Finding or None
        ``head_precision_mismatch`` (warning, naming the lower-precision side's cause),
        ``head_precision_low`` (both in a 16-bit dtype: warning above ``tol``, else info),
        ``head_precision_matched`` or ``head_precision_unrecorded`` (info); where the dtypes are not
        recorded and the differences have the size of bf16 rounding of the logits,
        ``head_rounding_in_differences`` (warning, cause ``bf16_head_rounding``: the side is unknown);
        where the trainer's head dtype is not recorded and its largest logits are bfloat16 numbers
        (:func:`trainer_head_from_numbers`), ``trainer_head_quantised`` (warning, cause
        ``trainer_bf16_head``), or ``head_record_contradicted`` where it is recorded as float32;
        where both are recorded as float32 and the numbers say otherwise,
        ``head_record_contradicted`` (warning); ``None`` for an unscored trace.
    """
    if not has_trainer(trace):
        return None
    tol = defaults().tol if tol is None else tol
    dt = cell_dtypes(trace)
    arm = arm_record(trace).arm
    r, t = dt["rollout_head"], dt["trainer_head"]
    ev = {"rollout_head_dtype": r, "trainer_head_dtype": t, "rollout_body_dtype": dt["rollout_body"],
          "trainer_body_dtype": dt["trainer_body"], **_gap_evidence(trace, trainer, eps)}
    numbers = rounding_from_numbers(trace, evidence, prior)
    ev["from_the_numbers"] = numbers
    grid = trainer_head_from_numbers(trace)
    ev["trainer_logits_on_bf16_grid"] = grid
    found = _from_numbers(r, t, numbers, grid, ev, arm)
    if found is not None:
        return found
    return _from_record(r, t, ev, tol, arm)


def _from_numbers(r: str | None, t: str | None, numbers: dict, grid: dict, ev: dict, arm: str | None) -> Finding | None:
    """:func:`head_precision` from the numbers: the trainer's logits on the bf16 grid, or differences of
    the size of bf16 rounding, where the record is missing or says float32; None otherwise."""
    on_grid = (f"{grid.get('n_bf16', 0)} of the trainer's {grid.get('n_tokens', 0)} largest logits are exactly "
               f"bfloat16 numbers (share {grid.get('share', float('nan')):.3f}; a float32 head leaves about 2**-16)")
    if t is None and grid["bf16"]:
        return Finding(Layer.INFERENCE_PATH, "trainer_head_quantised", Severity.WARNING,
                       f"the trainer computes its logits in bfloat16: {on_grid}; the rollout's logits are "
                       "rounded differently, so every token's probability disagrees", ev, FIX_TRAINER_FP32, arm,
                       cause="trainer_bf16_head")
    if t == "float32" and grid["bf16"]:
        return Finding(Layer.INFERENCE_PATH, "head_record_contradicted", Severity.WARNING,
                       f"the trainer is recorded as projecting to logits in float32, yet {on_grid}: a bf16 lm_head "
                       "weight, a logits cast or a kernel that rounds its output", ev, FIX_TRAINER_FP32, arm,
                       cause="trainer_bf16_head")
    said = (f"median |r| below the argmax {numbers.get('share', float('nan')):.2f} +- "
            f"{numbers.get('share_se', float('nan')):.2g} of the bf16 rounding scale of the logits (parity reads "
            f"0.001-0.33, one bf16 side 0.42-1.22)")
    if (r is None or t is None) and numbers["rounding"]:
        return Finding(Layer.INFERENCE_PATH, "head_rounding_in_differences", Severity.WARNING,
                       f"the differences have the size of bfloat16 rounding of the logits ({said}): one side computes "
                       "its logits in bf16 and the other does not (or both, in different kernels); the numbers do "
                       "not say which side", ev, FIX_EITHER_FP32, arm, cause="bf16_head_rounding")
    if r == t == "float32" and numbers["rounding"]:
        return Finding(Layer.INFERENCE_PATH, "head_record_contradicted", Severity.WARNING,
                       f"both sides are recorded as projecting to logits in float32, yet the differences have the "
                       f"size of bfloat16 rounding of the logits ({said}): a logits cast, a bf16 lm_head weight or "
                       "a kernel that rounds its output", ev, FIX_EITHER_FP32, arm, cause="bf16_head_rounding")
    return None


def _from_record(r: str | None, t: str | None, ev: dict, tol: float, arm: str | None) -> Finding:
    """:func:`head_precision` from the recorded head dtypes: unrecorded, mismatched, matched in float32,
    or matched in a 16-bit dtype (a warning above ``tol``)."""
    if r is None or t is None:
        missing = "rollout (engine_effective.head_dtype)" if r is None else "trainer (trainer.head_dtype)"
        return Finding(Layer.INFERENCE_PATH, "head_precision_unrecorded", Severity.INFO,
                       f"the {missing} LM-head dtype is not recorded: the head precision cannot be compared",
                       ev, "capture with rlparity (it reads the engine's head dtype back) and record the "
                       "trainer's head dtype", arm)
    if r != t:
        low = r if _BITS.get(r, 0) < _BITS.get(t, 0) else t
        fix = FIX_ROLLOUT_FP32 if low == r else FIX_TRAINER_FP32
        if "float32" not in (r, t):
            fix = FIX_ROLLOUT_FP32 + "; and " + FIX_TRAINER_FP32
        return Finding(Layer.INFERENCE_PATH, "head_precision_mismatch", Severity.WARNING,
                       f"the rollout engine projects to logits in {r}, the trainer in {t}: the two sides "
                       f"round every logit differently (RMS d = {ev['rms_d']:.3g} nats, Pearson of "
                       f"token probabilities {ev['prob_pearson']:.4f})", ev, fix, arm,
                       cause="rollout_bf16_head" if low == r else "trainer_bf16_head")
    if r == "float32":
        return Finding(Layer.INFERENCE_PATH, "head_precision_matched", Severity.INFO,
                       "both sides project to logits in float32", ev, "", arm)
    sev = Severity.WARNING if np.isfinite(ev["rms_d"]) and ev["rms_d"] > tol else Severity.INFO
    return Finding(Layer.INFERENCE_PATH, "head_precision_low", sev,
                   f"both sides project to logits in {r}: matched, but each rounds its logits to "
                   f"{_BITS.get(r, '?')} significant bits in its own kernel (RMS d = {ev['rms_d']:.3g} nats)",
                   ev, FIX_ROLLOUT_FP32 + "; and " + FIX_TRAINER_FP32, arm,
                   cause="rollout_bf16_head" if sev == Severity.WARNING else None)


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=(),
                   evidence=None) -> list[Finding]:
    """The LM-head check of one arm (called by :func:`rlparity.diagnose.diagnose`).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    options : DiagnoseOptions, optional
        Reads ``tol``, ``trainer`` and ``eps``; None: the defaults.
    prior : sequence of Finding, default ()
        The earlier layers' findings for the arm (another cause that moves every token makes the
        reading from the numbers untestable).
    evidence : ArmEvidence, optional
        The arm's evidence (its residual, for the reading from the numbers).

    Returns
    -------
    list of Finding
        :func:`head_precision`'s finding, or empty.
    """
    opts = options or DiagnoseOptions()
    f = head_precision(trace, tol=opts.tol, trainer=opts.trainer, eps=opts.eps, evidence=evidence, prior=prior)
    return [f] if f is not None else []


def _matrix_arms(arms: Mapping[str, xr.Dataset]) -> dict[str, xr.Dataset]:
    """The arms that belong to a head-dtype matrix (their factors are the two head dtypes, as
    ``head_matrix`` records them), one per cell."""
    out, seen = {}, set()
    for name, ds in arms.items():
        if not set(CELL_DIMS) <= set(arm_factors(ds)) or not has_trainer(ds):
            continue
        dt = cell_dtypes(ds)
        key = (dt["rollout_head"], dt["trainer_head"])
        if None in key or key in seen:
            continue
        seen.add(key)
        out[name] = ds
    return out


def head_matrix_finding(arms: Mapping[str, xr.Dataset], *, variable: str = "abs_log_ratio_rms",
                        trainer: str | None = None, eps: float | None = None) -> Finding | None:
    """Over a head-dtype matrix: whether the matched float32/float32 cell is the closest, and by how much.

    A warning when a mismatched cell is as close as the matched one: then something other than the
    head (e.g. the body precision) dominates the gap.

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        The arms of a store; those whose factors are the two head dtypes form the matrix (one per
        cell).
    variable : str, default "abs_log_ratio_rms"
        The :func:`rlparity.metrics.head_precision.head_table` variable compared (nats).
    trainer : str, optional
        The trainer reading; None: the default.
    eps : float, optional
        Clip range for the table; None: ``defaults().eps``.

    Returns
    -------
    Finding or None
        ``head_fp32_matched_closest`` (info) or ``head_fp32_not_closest`` (warning); ``None``
        unless the arms hold a float32/float32 cell and at least one mismatched cell.
    """
    cells = _matrix_arms(arms)
    if len(cells) < 2:
        return None
    table = head_table(cells, trainer=trainer, eps=eps)
    try:
        adv = matched_advantage(table, variable=variable)
    except ValueError:
        return None
    ev = {"matched_cell": adv["matched_cell"], f"matched_{variable}": adv["matched_value"],
          **{f"{k}_{variable}": v["value"] for k, v in adv["mismatched"].items()},
          "smallest_ratio_mismatched_over_matched": adv["min_ratio"], "pair": PAIR}
    if adv["matched_is_lowest"]:
        return Finding(Layer.INFERENCE_PATH, "head_fp32_matched_closest", Severity.INFO,
                       f"the matched float32 head has the smallest {variable}: every mismatched cell is at "
                       f"least {adv['min_ratio']:.2f}x larger", ev, "", None)
    return Finding(Layer.INFERENCE_PATH, "head_fp32_not_closest", Severity.WARNING,
                   f"a mismatched head cell is as close as the matched float32 one ({variable}): the head "
                   "precision is not what limits parity here; look at the body precision and kernels",
                   ev, "pin the body dtype on both sides and compare the body's hidden states", None)


def arms_findings(arms: Mapping[str, xr.Dataset], options: DiagnoseOptions | None = None) -> list[Finding]:
    """The head-matrix check over the arms of one store (called by :func:`rlparity.diagnose.diagnose`).

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        Every arm of the store.
    options : DiagnoseOptions, optional
        Reads ``trainer`` and ``eps``; None: the defaults.

    Returns
    -------
    list of Finding
        :func:`head_matrix_finding`'s finding, or empty.
    """
    opts = options or DiagnoseOptions()
    f = head_matrix_finding(arms, trainer=opts.trainer, eps=opts.eps)
    return [f] if f is not None else []



# the finding codes this topic emits (collected by rlparity.diagnose.catalogue)
CODES: tuple[FindingCode, ...] = (
    code("head_precision_mismatch", PATH, (W,),
           "The rollout engine and the trainer project to logits in different precisions: they round every logit "
           "differently, so every token's probability disagrees (MiniMax-M1's mismatch).",
           FIX_ROLLOUT_FP32 + " (a low-precision rollout head); or " + FIX_TRAINER_FP32
           + " (a low-precision trainer head)", "head_precision", rule="the two recorded head dtypes differ",
           calibrated_on="exact (recorded dtypes)", causes=("rollout_bf16_head", "trainer_bf16_head")),
    code("head_precision_low", PATH, (I, W),
           "Both sides project to logits in a low precision (e.g. bf16): matched, but each rounds its logits in its own "
           "kernel; a warning when the measured gap is above the tolerance.",
           FIX_ROLLOUT_FP32 + "; and " + FIX_TRAINER_FP32, "head_precision", rule="RMS of d above `tol` nats",
           thresholds=("tol",), calibrated_on=CPU_TINY, causes=("rollout_bf16_head",)),
    code("head_precision_matched", PATH, (I,),
           "Both sides project to logits in float32: the LM head adds no precision mismatch.", FIX_NONE, "head_precision",
           calibrated_on="exact (recorded dtypes)"),
    code("head_precision_unrecorded", PATH, (I,),
           "The rollout's or the trainer's LM-head dtype is not recorded: the head precision cannot be compared.",
           "capture with rlparity (it reads the engine's head dtype back) and record the trainer's head dtype", "head_precision"),
    code("head_rounding_in_differences", PATH, (W,),
           "The head dtypes are not recorded, and the differences have the size of bfloat16 rounding of the logits: one "
           "side computes its logits in bf16 and the other does not (or both, in different kernels). The numbers do not "
           "say which side.", FIX_EITHER_FP32, "head_precision",
           rule="median over non-argmax tokens of |r| / (bf16 spacing of the trainer's largest logit / sqrt 6 / T) at "
                "least `head_rounding_share` by `temperature_z` jackknife errors (with K < jackknife_groups groups "
                "times t(K - 1) / t(jackknife_groups - 1) at the same level); untestable beside another cause that "
                "moves every token (penalty, temperature, cut, dropout) or a trainer whose run-to-run noise is a quarter "
                "of the rounding scale", thresholds=("head_rounding_share", "temperature_z"),
           calibrated_on="held out from the H200 fault matrix: parity 0.001-0.33 (h200-inflight, h100-ablation, h200-rl, "
                         "h200-moe, the fp32 semantic arms), one bf16 side 0.42-1.22 (h200-head, h200-semantic, cpu-head, "
                         "cpu-semantic, h200-rl's bf16-head arm); checked on three held-out H100 matrices: parity arms "
                         "0.10-0.20, one bf16 side 0.55-0.78. The bar for fewer groups (session 50): on the "
                         "re-captured CPU tiny-bf16 calibration seeds 0-4 a reading of 6 sequences (share 1.17 +- 0.23, "
                         "no bf16 head) cleared 3 errors; at 3 * t(5) / t(19) = 4.8 it does not, while cpu-head's bf16 "
                         "readings (6 sequences, 1.06-1.22 +- 0.06) still do", causes=("bf16_head_rounding",)),
    code("head_record_contradicted", PATH, (W,),
           "A side recorded as computing its logits in float32 whose numbers say bfloat16: the trainer's largest logits "
           "are bfloat16 numbers, or (both recorded float32) the differences have the size of bfloat16 rounding of the "
           "logits: a logits cast, a bf16 lm_head weight or a kernel that rounds its output.",
           FIX_EITHER_FP32, "head_precision", rule="as trainer_head_quantised on an arm whose trainer head is recorded "
           "as float32; else as head_rounding_in_differences, on an arm whose recorded head dtypes are both float32",
           thresholds=("head_quantised_share", "min_quantised_tokens", "head_rounding_share", "temperature_z"),
           calibrated_on="as trainer_head_quantised and head_rounding_in_differences",
           causes=("trainer_bf16_head", "bf16_head_rounding")),
    code("trainer_head_quantised", PATH, (W,),
           "The trainer's head dtype is not recorded, and its largest logits are exactly bfloat16 numbers (8 significant "
           "bits): the trainer computes its logits in bf16, so they are rounded unlike the rollout's.",
           FIX_TRAINER_FP32, "head_precision",
           rule="share of the response tokens' trainer_max_logit exactly on the bfloat16 grid at least "
                "`head_quantised_share`, over at least `min_quantised_tokens` tokens",
           thresholds=("head_quantised_share", "min_quantised_tokens"),
           calibrated_on="chosen on H100 bf16 small seed 1 (fxA+fxB) and CPU tiny-bf16 seeds 0-4: share 1.0 on every "
                         "trainer_bf16_head arm, 0.0 on every other arm; held out: H100 seeds 2-3, CPU seeds 5-9 (the "
                         "same split), benchmarks/results/blind_matrices.json", causes=("trainer_bf16_head",)),
    code("head_fp32_matched_closest", PATH, (I,),
           "Over a head-dtype matrix: the matched float32 cell has the smallest gap; every mismatched cell is larger.",
           FIX_NONE, "head_precision", rule="the matched cell's RMS of d is the lowest of the matrix", across_arms=True),
    code("head_fp32_not_closest", PATH, (W,),
           "Over a head-dtype matrix: a mismatched cell is as close as the matched float32 one, so something other than "
           "the head (e.g. the body precision) limits parity.",
           "pin the body dtype on both sides and compare the body's hidden states", "head_precision",
           rule="some mismatched cell's RMS of d is not above the matched cell's", across_arms=True),
)

TOPIC = Topic('head_precision', 30, CODES, trace_findings, arms_findings)

__all__ = ["FIX_ROLLOUT_FP32", "FIX_TRAINER_FP32", "arms_findings", "head_matrix_finding", "head_precision",
           "trace_findings", "trainer_head_from_numbers"]
