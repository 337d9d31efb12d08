"""What the diagnosis of one arm knows before any layer judges it.

Causes come together in real runs, and the evidence of one layer is polluted by the others: a
semantic fit over every token sees stale-KV tokens as noise (and can call a processed rollout
raw), and a stale-cache ratio measured against a raw-mode floor looks small. So the evidence is
built in this order, and every layer judges on it:

1. **Tokens explained by observation** (:meth:`ArmEvidence.claim`): the engine's own records
   say which tokens a cause touched, before any number is compared: sequences whose prompt hit a
   prefix cache not reset since an update (``stale_prefix_cache``), tokens sampled on KV of older
   weights (``kv_carried_over``), tokens of other versions than the one weight set that scored
   them (``mixed_versions``), responses the trainer scored after its own, different prompt ids
   (``prompt_token_mismatch``).
2. **The semantic reading** (:func:`semantic_fit`) on the tokens nothing explains: where the
   rollout logprob lies between the trainer's raw and processed readings (a robust fit, so a cause
   not yet identified cannot drag it), and the **residual** ``r = mu - matched reading`` on every
   token: the mismatch left once the semantic cause is corrected.
3. **Tokens explained by numbers**: the tokens of a policy version whose residual stands far
   above the other versions' (``weights_differ``: the engine and the trainer held different
   weights for it; :func:`version_claims`, the model in :mod:`rlparity.metrics.versions`); then
   the semantic fit is repeated without them.
4. **Tokens routed to other experts**: a mixture-of-experts model's tokens whose top-k experts differ
   between the engine's and the trainer's records, unless another cause already explains them
   (``moe_routing_disagreement``, or the router-precision cause that makes the flips); then the
   semantic fit is repeated without them.
5. **The floors**: the background (mean ``|r|`` of the tokens no cause explains), and the
   trainer's own floor (what its self-check measured: batch shape, run to run).

The localized checks of every layer measure their tokens' residual against the background, and
:mod:`rlparity.diagnose.attribution` splits the measured excess among the causes found.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.metrics import TRAINER_VARIABLE, core, log_ratio, trainer_readings, trainer_side
from rlparity.metrics import inflight as mi
from rlparity.metrics.floors import recorded_floors as trainer_floor
from rlparity.metrics.floors import version_floors
from rlparity.metrics import semantic as msem
from rlparity.metrics import versions as mv
from rlparity.trace import arm_record, has_trainer, trace_versions
from rlparity.trace.prompts import prompt_mismatch_sequences
from rlparity.diagnose.routing_evidence import router_dtypes, routing_cause, routing_claims
from rlparity.trace.weights import (compare_checksums, engine_effective, tensors_not_equal, trainer_checksums,
                                     versions_that_differ)


@dataclass
class ArmEvidence:
    """The evidence of one scored arm (see the module docstring).

    Arrays are ``(sequence, position)``. Made by :func:`build`; the layers read it, and the
    claims grow as causes are identified.

    Parameters
    ----------
    trace : xarray.Dataset
        The scored arm.
    side : str
        The trainer reading in use (``"processed"`` or ``"raw"``).
    mask : numpy.ndarray
        Real response tokens (bool).
    d : numpy.ndarray
        ``d = log pi_old - log mu`` per token (nats; ``-inf`` where pi_old = 0).
    claims : dict of str to numpy.ndarray, optional
        Per cause, the tokens it explains (bool).
    scopes : dict of str to str, optional
        Per cause, what its tokens are, in words.
    fit : dict, optional
        The semantic fit (:func:`semantic_fit`).
    reading : str, default "untestable"
        The reading the rollout matches: ``"processed"``, ``"raw"``, ``"neither"`` or
        ``"untestable"``.
    residual : numpy.ndarray or None, default None
        ``r = mu - matched reading`` per token (nats; :func:`residual_for`).
    version_excess : dict, optional
        Mean ``|r|`` per policy version and the versions flagged (:func:`version_claims`).
    """

    trace: xr.Dataset
    side: str
    mask: np.ndarray
    d: np.ndarray
    claims: dict[str, np.ndarray] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    reading: str = "untestable"
    residual: np.ndarray | None = None
    version_excess: dict[str, Any] = field(default_factory=dict)

    # --------------------------------------------------------------------------- tokens
    @property
    def finite_tokens(self) -> np.ndarray:
        """Real tokens with a finite d (the trainer gives them a probability > 0).

        Returns
        -------
        numpy.ndarray
            ``(sequence, position)`` bool.
        """
        return self.mask & np.isfinite(self.d)

    def claim(self, cause: str, tokens: np.ndarray, scope: str) -> None:
        """Record that ``cause`` explains ``tokens`` (added to what it already explains).

        Tokens outside the mask are ignored; nothing is recorded when none is left.

        Parameters
        ----------
        cause : str
            A key of :data:`rlparity.diagnose.causes.CAUSES` (or an evidence claim such as
            ``"weights_differ"``).
        tokens : numpy.ndarray
            ``(sequence, position)`` bool, the tokens it explains.
        scope : str
            What those tokens are, in words.
        """
        tokens = np.asarray(tokens, dtype=bool) & self.mask
        if not tokens.any():
            return
        self.claims[cause] = self.claims.get(cause, np.zeros_like(tokens)) | tokens
        self.scopes[cause] = scope

    def claimed(self, exclude: tuple[str, ...] = ()) -> np.ndarray:
        """Tokens some identified cause explains.

        Parameters
        ----------
        exclude : tuple of str, default ()
            Causes whose tokens are left out.

        Returns
        -------
        numpy.ndarray
            ``(sequence, position)`` bool.
        """
        out = np.zeros_like(self.mask)
        for c, t in self.claims.items():
            if c not in exclude:
                out |= t
        return out

    def unclaimed(self) -> np.ndarray:
        """Usable tokens no identified cause explains.

        Where the semantic fit and the background are measured.

        Returns
        -------
        numpy.ndarray
            ``(sequence, position)`` bool.
        """
        return self.finite_tokens & ~self.claimed()

    def token_scope(self, cause: str) -> dict[str, Any]:
        """How many tokens and sequences ``cause`` explains, and what they are.

        Parameters
        ----------
        cause : str
            A cause; one that claims no tokens covers every usable token.

        Returns
        -------
        dict
            ``{"scope", "n_tokens", "n_sequences"}`` over the usable tokens.
        """
        t = self.claims.get(cause)
        if t is None:
            t, scope = self.finite_tokens, "every token"
        else:
            t, scope = t & self.finite_tokens, self.scopes.get(cause, cause)
        return {"scope": scope, "n_tokens": int(t.sum()), "n_sequences": int(t.any(axis=1).sum())}

    # --------------------------------------------------------------------------- residual
    def abs_residual_mean(self, tokens: np.ndarray) -> float:
        """Mean ``|r|`` over ``tokens`` (nats).

        Parameters
        ----------
        tokens : numpy.ndarray
            ``(sequence, position)`` bool; only the usable ones count.

        Returns
        -------
        float
            The mean, NaN when no token is usable.
        """
        assert self.residual is not None
        return float(core.masked_mean(np.abs(self.residual), tokens & self.finite_tokens))

    def background(self) -> float:
        """Mean ``|r|`` of the tokens no cause explains (nats).

        What a localized cause's tokens are measured against.

        Returns
        -------
        float
            The background, NaN when every usable token is claimed.
        """
        return self.abs_residual_mean(self.unclaimed())

    def localized_test(self, cause: str, *, ratio: float, tol: float, z: float = 4.0) -> dict[str, Any]:
        """Whether the tokens ``cause`` explains stand above the background (mean ``|r|``, nats).

        Parameters
        ----------
        cause : str
            The cause whose claimed tokens are tested.
        ratio : float
            Their mean at least this many times the background's is ``"measured"``.
        tol : float
            An excess above this many nats (with ``z`` standard errors) is ``"measured"``; one below it
            with 97.5% confidence is ``"small"``.
        z : float, default 4.0
            Standard errors the excess must exceed with ``tol``.

        Returns
        -------
        dict
            ``verdict``: ``"measured"``, ``"small"`` (the cause barely moved these tokens) or
            ``"inconclusive"`` (another cause's mismatch on every token hides it: measure again after
            fixing that); with the token counts, both means, their ratio, the excess, its standard
            error, z and the thresholds.
        """
        assert self.residual is not None
        a = np.abs(self.residual)
        tokens = self.claims.get(cause, np.zeros_like(self.mask)) & self.finite_tokens
        free = self.unclaimed()
        c, b = a[tokens], a[free]
        out: dict[str, Any] = {"n_tokens": int(c.size), "n_background_tokens": int(b.size)}
        if c.size == 0:
            return {**out, "verdict": "small"}
        mc = float(c.mean())
        mb = float(b.mean()) if b.size else 0.0
        se = float(np.sqrt((c.var(ddof=1) if c.size > 1 else mc ** 2) / c.size
                           + ((b.var(ddof=1) / b.size) if b.size > 1 else 0.0)))
        excess = mc - mb
        zz = excess / se if se > 0 else (float("inf") if excess > 0 else 0.0)
        rr = mc / mb if mb > 0 else (float("inf") if mc > 0 else float("nan"))
        if (np.isfinite(rr) and rr >= ratio) or rr == float("inf") or (excess > tol and zz >= z):
            verdict = "measured"
        elif excess + 2 * se < tol:
            verdict = "small"
        else:
            verdict = "inconclusive"
        return {**out, "abs_residual_mean": mc, "background_abs_residual_mean": mb, "ratio": rr,
                "excess": excess, "excess_se": se, "z": zz, "verdict": verdict, "ratio_threshold": ratio,
                "tol": tol}

    def trainer_floor(self) -> dict[str, float]:
        """The trainer's own floor from its self-check, on the reading in use.

        Returns
        -------
        dict of str to float
            RMS of batch-shape and run-to-run differences and the mean-absolute floors (nats; NaN
            where not measured), :func:`rlparity.metrics.floors.recorded_floors`.
        """
        return trainer_floor(self.trace, self.side)


# ------------------------------------------------------------------------------- semantic fit
def sequence_se(fit: Callable[..., dict[str, float]], y: np.ndarray, x: np.ndarray, tokens: np.ndarray,
                token_se: float) -> dict[str, Any]:
    """A slope's standard error that holds when tokens of a sequence are not independent.

    The larger of the per-token (sandwich) standard error and a delete-a-group jackknife over
    whole sequences (:func:`rlparity.metrics.core.fits.jackknife_slope_se`, at most
    ``defaults().jackknife_groups`` groups). Past ``defaults().jackknife_max_tokens`` tokens the
    jackknife runs on whole sequences taken at an even stride and its error is scaled by
    ``sqrt(tokens used / tokens)`` (a slope's error shrinks as one over the root of the data). With
    fewer than ``defaults().min_fit_sequences`` sequences the error is NaN: too few to claim anything
    (the reading is then untestable).

    Parameters
    ----------
    fit : callable
        ``fit(y, x, mask)`` returning a dict with the slope under ``"alpha"``
        (:func:`rlparity.metrics.core.fits.reading_fit` or a partial of
        :func:`~rlparity.metrics.core.fits.robust_reading_fit`).
    y, x : numpy.ndarray
        ``(sequence, position)``: the reading placed and the difference of the two candidates (nats).
    tokens : numpy.ndarray
        ``(sequence, position)`` bool, the tokens fitted on.
    token_se : float
        The per-token standard error of the full fit.

    Returns
    -------
    dict
        ``alpha_se`` (the one used), ``alpha_se_token``, ``alpha_se_jackknife`` and
        ``n_sequences_fitted``.
    """
    o = defaults()
    t = np.asarray(tokens, bool)
    per_seq = t.sum(axis=tuple(range(1, t.ndim))) if t.ndim > 1 else t.astype(int) if t.ndim else np.zeros(0, int)
    n_seq, n_tok = int((per_seq > 0).sum()), int(per_seq.sum())
    rows = np.flatnonzero(per_seq > 0)
    if n_tok > o.jackknife_max_tokens:  # whole sequences at an even stride, then the error scaled to all tokens
        rows = rows[:: int(np.ceil(n_tok / o.jackknife_max_tokens))]
    ys, xs, ts = y[rows], x[rows], t[rows]  # compact copies: each refit touches only these
    jk = core.jackknife_slope_se(lambda m: fit(ys, xs, m)["alpha"], ts, groups=o.jackknife_groups)
    jk_se = jk["se"] * float(np.sqrt(ts.sum() / max(n_tok, 1)))
    se = max(token_se, jk_se) if np.isfinite(jk_se) else float("nan")
    if n_seq < o.min_fit_sequences:
        se = float("nan")
    return {"alpha_se": se, "alpha_se_token": token_se, "alpha_se_jackknife": jk_se, "n_sequences_fitted": n_seq}


def semantic_fit(trace: xr.Dataset, tokens: np.ndarray, *, semantic_tol: float | None = None
                 ) -> dict[str, Any]:
    """Where the rollout logprob ``mu`` lies between the trainer's raw and processed readings.

    ``mu - raw = alpha (processed - raw) + noise``, a robust fit
    (:func:`rlparity.metrics.core.fits.robust_reading_fit`) on ``tokens``.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    tokens : numpy.ndarray
        ``(sequence, position)`` bool, the tokens fitted on.
    semantic_tol : float, optional
        The tolerance on alpha (dimensionless); None: ``defaults().semantic_tol``.

    Returns
    -------
    dict
        The fit (``alpha``, ``alpha_se``, ...), ``alpha_band`` (``semantic_tol`` or three standard
        errors, the larger) and ``reading``: ``"processed"`` (alpha ~ 1), ``"raw"`` (alpha ~ 0),
        ``"neither"``, or ``"untestable"`` (the readings too close at this noise; with one reading
        or identity sampling only ``reading`` and ``why``).
    """
    semantic_tol = defaults().semantic_tol if semantic_tol is None else semantic_tol
    readings = trainer_readings(trace)
    if len(readings) < 2 or msem.identity_sampling(trace):
        return {"reading": "untestable", "why": "one trainer reading" if len(readings) < 2 else "identity sampling"}
    P, R = trace[TRAINER_VARIABLE["processed"]].values, trace[TRAINER_VARIABLE["raw"]].values
    mu = trace["rollout_logprob"].values
    y, x = mu - R, P - R
    fit = core.robust_reading_fit(y, x, tokens)
    refit = functools.partial(core.robust_reading_fit, start=fit["alpha"])
    fit = {**fit, **sequence_se(refit, y, x, tokens, fit["alpha_se"])}
    alpha, se = fit["alpha"], fit["alpha_se"]
    band = max(semantic_tol, 3 * se) if np.isfinite(se) else semantic_tol
    # the trainer's own run-to-run noise (its self-check, both readings) against the gap the fit must resolve:
    # two noisy readings from one forward put the noise on both sides of the fit (errors in variables)
    floors = {side: trainer_floor(trace, side)["run_to_run_rms"] for side in ("processed", "raw")}
    noise = float(sum(floors.values()) / np.sqrt(2))
    ratio = noise / fit["separation_rms"] if fit.get("separation_rms") else float("nan")
    fit = {**fit, "trainer_noise_rms": noise, "trainer_noise_ratio": ratio}
    if np.isfinite(ratio) and ratio > defaults().semantic_max_trainer_noise:
        reading = "untestable"
    elif not np.isfinite(alpha) or not np.isfinite(se) or se > semantic_tol:
        reading = "untestable"
    elif abs(alpha - 1) <= band:
        reading = "processed"
    elif abs(alpha) <= band:
        reading = "raw"
    else:
        reading = "neither"
    return {**fit, "alpha_band": band, "reading": reading}


def residual_for(trace: xr.Dataset, fit: dict[str, Any], side: str) -> np.ndarray:
    """``r = mu - matched reading`` per token (nats).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    fit : dict
        Its semantic fit (:func:`semantic_fit`).
    side : str
        The reading in use, taken when the fit is untestable.

    Returns
    -------
    numpy.ndarray
        ``(sequence, position)``: against the processed or raw reading the fit matched, the fitted
        line ``raw + alpha (processed - raw)`` when it matches neither, else the reading in use.
    """
    mu = trace["rollout_logprob"].values
    reading = fit.get("reading")
    if reading in ("processed", "raw"):
        return mu - trace[TRAINER_VARIABLE[reading]].values
    if reading == "neither":
        P, R = trace[TRAINER_VARIABLE["processed"]].values, trace[TRAINER_VARIABLE["raw"]].values
        return mu - (R + fit["alpha"] * (P - R))
    return mu - trace[TRAINER_VARIABLE[side]].values


# ------------------------------------------------------------------------------- claims
def observed_claims(ev: ArmEvidence) -> None:
    """Claim tokens from the engine's and the trainer's own records, in place (no logprob compared).

    Stale prefix-cache sequences, tokens sampled on KV of older weights, tokens of older versions
    scored with one weight set, versions whose weight fingerprints differ, and (with re-tokenized
    prompts) responses scored after other prompt ids.

    Parameters
    ----------
    ev : ArmEvidence
        The evidence to add the claims to.
    """
    trace = ev.trace
    stale = mi.stale_sequences(trace)
    if stale.any():
        ev.claim("stale_prefix_cache", stale[:, None] & ev.mask, "sequences whose prompt hit a stale prefix cache")
    carried = mi.carried_tokens(trace)
    if carried.any():
        ev.claim("kv_carried_over", carried & ~stale[:, None], "tokens sampled on KV of older weights")
    versions = trace_versions(trace)
    rec = arm_record(trace)
    if len(versions) > 1 and rec.scorer.scored_by != "policy_version":
        pv = trace["policy_version"].values
        ev.claim("mixed_versions", pv != max(versions), "tokens of older versions scored with one weight set")
    pv = trace["policy_version"].values
    for v, cmp in versions_that_differ(trace.attrs, versions).items():
        ev.claim("weights_differ", pv == v, f"tokens of policy version {v} (the two sides' weights differ: "
                 f"{len(tensors_not_equal(cmp))} tensor(s))")
    settings = rec.scorer.settings or {}
    # the trainer's own tokenization is recorded; unless the trainer says it scored with the engine's ids, the
    # responses after other prompt ids are its to explain (a user's run records no scorer setting)
    if settings.get("prompt_ids", "retokenize") == "retokenize":
        bad = prompt_mismatch_sequences(trace)
        if bad.any():
            ev.claim("prompt_token_mismatch", bad[:, None] & ev.mask,
                     "responses the trainer scored after other prompt ids than the engine's")


def fingerprints_equal(trace: xr.Dataset, versions: list[int]) -> list[int]:
    """The versions whose engine and trainer weight fingerprints were both recorded and agree.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm (``attrs["engine_weight_checksums"]`` and the trainer's checksums per version).
    versions : list of int
        The versions to look at.

    Returns
    -------
    list of int
        Those of ``versions`` whose checksums agree (:func:`rlparity.trace.weights.compare_checksums`).
    """
    engine, trainer = engine_effective(trace.attrs), trainer_checksums(trace.attrs, versions)
    return [v for v in versions if v in engine and v in trainer and compare_checksums(engine[v], trainer[v])["equal"]]


def version_claims(ev: ArmEvidence, *, thresholds: mv.VersionThresholds | None = None) -> dict[str, Any]:
    """Claim the policy versions whose tokens stand far above the first version's as ``weights_differ``.

    The per-version floor model (:func:`rlparity.metrics.versions.version_excess`) on the arm's
    ``|r|`` and its tokens no other cause explains, with the trainer's floor per version
    (``self_check_per_version``), its run-to-run noise and the versions whose engine and trainer
    fingerprints were both recorded and agree, and ``|r| / (1 - p)`` (the residual read at the logits,
    :func:`rlparity.metrics.versions.logit_scale`, ``p`` the smaller of the rollout's and the matched
    reading's probability). Needs two versions, each scored at its own version, and no fingerprint
    claim already.

    Parameters
    ----------
    ev : ArmEvidence
        The evidence (with its residual); claims are added in place.
    thresholds : rlparity.metrics.versions.VersionThresholds, optional
        The thresholds of :func:`rlparity.metrics.versions.version_excess` (None: the defaults).

    Returns
    -------
    dict
        :func:`rlparity.metrics.versions.version_excess` (its ``flagged`` versions claimed); empty when
        the test does not apply.
    """
    trace = ev.trace
    versions = trace_versions(trace)
    if len(versions) < 2 or arm_record(trace).scorer.scored_by != "policy_version" or ev.residual is None:
        return {}
    if "weights_differ" in ev.claims:  # the fingerprints already name the versions
        return {}
    pv = trace["policy_version"].values
    equal = fingerprints_equal(trace, versions)
    absr = np.abs(ev.residual)
    mu = trace["rollout_logprob"].values
    out = mv.version_excess(absr, ev.unclaimed(), pv, floors=version_floors(trace, ev.side),
                            noise=trainer_floor(trace, ev.side).get("run_to_run_mean_abs", float("nan")),
                            fingerprints_equal=equal, scaled=mv.logit_scale(absr, mu, mu - ev.residual),
                            thresholds=thresholds)
    for v in out.get("flagged", []):
        ev.claim("weights_differ", (pv == v) & ev.mask, f"tokens of policy version {v}")
    return out


def build(trace: xr.Dataset, *, trainer: str | None = None, semantic_tol: float | None = None) -> ArmEvidence:
    """The evidence of one scored arm (see the module docstring).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    trainer : str, optional
        The trainer reading (``"processed"`` or ``"raw"``); None: the default, or the one the trace
        holds.
    semantic_tol : float, optional
        Tolerance of the semantic fit (:func:`semantic_fit`); None: ``defaults().semantic_tol``.

    Returns
    -------
    ArmEvidence
        Claims, semantic fit, reading, residual and version excess.
    """
    side = trainer_side(trace, trainer)
    mask = trace["response_mask"].values.astype(bool)
    d = log_ratio(trace, side).values if has_trainer(trace) else np.full(mask.shape, np.nan)
    ev = ArmEvidence(trace, side, mask, d)
    observed_claims(ev)
    for _ in range(2):  # fit, claim the versions that stand out, fit again without them
        ev.fit = semantic_fit(trace, ev.unclaimed(), semantic_tol=semantic_tol)
        ev.reading = ev.fit["reading"]
        ev.residual = residual_for(trace, ev.fit, side)
        before = set(ev.claims)
        ev.version_excess = version_claims(ev) or ev.version_excess
        if set(ev.claims) == before:
            break
    if routing_claims(ev):  # after the versions: flips where the weights differ are not routing's
        ev.fit = semantic_fit(trace, ev.unclaimed(), semantic_tol=semantic_tol)
        ev.reading = ev.fit["reading"]
        ev.residual = residual_for(trace, ev.fit, side)
    return ev


__all__ = ["ArmEvidence", "build", "fingerprints_equal", "observed_claims", "residual_for", "router_dtypes", "routing_cause", "routing_claims", "semantic_fit", "trainer_floor",
           "version_claims"]
