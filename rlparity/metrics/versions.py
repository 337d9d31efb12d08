"""The per-version floor model: does a later policy version's residual stand above the first version's?

Both sides of an RL run load the first version of a trace from one checkpoint; a partial sync, or a
trainer that skipped one, shows on the tokens of a version after an update. :func:`version_excess`
compares each later version's ``|r|`` (``r = mu - matched reading``, nats) with the first version's,
each over what its own floor predicts (:func:`floor_excess_ratio`, the floor's share read from the
means), with a jackknife over sequences.

A numpy core over token arrays whose first axis is the sequence (``(sequence, position)``): the
diagnosis (:func:`rlparity.diagnose.evidence.version_claims`) reads the arrays and the floors from
a trace and claims the versions flagged here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlparity.config.defaults import defaults
from rlparity.metrics import core

# the two statistics of the per-version test: the median (robust: a few tokens of a near-flat distribution carry
# most of the mean) and the mean (a partial sync moves a few tokens a lot: on the held-out H100 matrices the median
# found 3 of 24 partial-sync arms, the mean 11, with no false flag on their 75 other arms at ratio 1.6 and z 3;
# the H200 example's partial syncs show in the median only). Either one at the ratio and z flags a version.
def upper_quartile(a: np.ndarray) -> float:
    """The 0.75 quantile of ``a`` (numpy's linear interpolation), the per-version test's tail statistic.

    Parameters
    ----------
    a : numpy.ndarray
        Values (``|r|`` of one version's tokens, nats).

    Returns
    -------
    float
        ``numpy.quantile(a, 0.75)``.
    """
    return float(np.quantile(a, 0.75))


# fewest tokens no other cause explains a version needs before :func:`version_excess` reads it
MIN_VERSION_TOKENS = 4

VERSION_STATISTICS = {"median": np.median, "mean": np.mean, "logit_median": np.median, "upper_quartile": upper_quartile}
# the upper quartile (issue 41): a partial sync moves a minority of a version's tokens far, which the median misses and
# the mean shares with the few tokens of near-flat distributions that carry most of it; on the CPU tiny-bf16
# calibration seeds 0-4 no arm without a weight fault reaches 1.6x in it (90 testable arms), while it adds a partial
# sync beside a bf16 trainer head (2.43x, z 2.84) that the other three miss (defaults.version_quartile_ratio)
# the statistics read on |r| / (1 - p) (p: the token's probability, the smaller side's) rather than on |r|: a logit
# moved by e moves a token's log-probability by about e (1 - p), so a version whose tokens are more peaked reads a
# smaller |r| from the same logit disagreement (the CPU tiny-bf16 clean arms: version 1's median |r| 0.57-1.83x version
# 0's, the same seed's partial sync 1.26-3.8x; issue 41)
LOGIT_STATISTICS = ("logit_median",)
# the smallest 1 - p the logit statistics divide by: a token the trainer gives p = 1 within float32 (|r| is its noise)
LOGIT_Q_MIN = 1e-6


def logit_scale(absr: np.ndarray, mu: np.ndarray, matched: np.ndarray) -> np.ndarray:
    """``|r| / (1 - p)`` per token: the residual read at the logits.

    A logit disagreement ``e`` on the sampled token (the rest of the distribution fixed) moves its
    log-probability by about ``e (1 - p)``, ``p`` its probability; dividing by ``1 - p`` reads ``e``
    whatever the token's confidence. ``p`` is the smaller of the two sides' probabilities (a token one
    side gives ``p = 1`` and the other does not is a disagreement, not a confident token), and
    ``1 - p`` at least :data:`LOGIT_Q_MIN`.

    Parameters
    ----------
    absr : numpy.ndarray
        ``|r|`` per token (nats).
    mu : numpy.ndarray
        The rollout's log-probability of the token (nats).
    matched : numpy.ndarray
        The matched trainer reading's log-probability of the token (``mu - r``, nats).

    Returns
    -------
    numpy.ndarray
        ``|r| / max(1 - exp(min(mu, matched)), LOGIT_Q_MIN)``; NaN where an input is not finite.
    """
    q = -np.expm1(np.minimum(np.asarray(mu, dtype=float), np.asarray(matched, dtype=float)))
    return np.asarray(absr, dtype=float) / np.maximum(q, LOGIT_Q_MIN)


def floor_excess_ratio(level: float, ref_level: float, floor: float, ref_floor: float,
                       ref_mean: float | None = None) -> float:
    """A later version's level of ``|r|`` over what its own floor predicts from the first version's.

    The first version's ``|r|`` is its floor plus a part the floor does not explain (the two
    implementations' own difference), which the weights of a later version do not change. The floors are
    mean ``|d|`` of the trainer's self-check, so that part is measured in the same statistic: ``c =
    max(ref_mean - ref_floor, 0)``, ``ref_mean`` the first version's mean ``|r|``. A later version is
    expected at ``k = (c + floor) / (c + ref_floor)`` times the first version's level in every statistic
    (the floor takes the same share of each statistic as of the mean), and the ratio is ``(level /
    ref_level) / k``: a version whose residual is all floor (``c = 0``) is measured against its floor
    alone, one far above its floor against the first version's level. Issue 41: on the H100 matrices
    version 1's self-check floor is 1.5-2.9x version 0's while its clean residual is not higher; with
    ``c`` taken from the median (below the mean floor, so ``c = 0``) the median and the upper quartile
    were divided by the full floor ratio, which hid the partial syncs of H100 seeds 11 and 13 (version
    1 median 2.7-3.6x version 0's, floors 2.5-2.8x). Without ``ref_mean``, ``c`` is read from
    ``ref_level`` (the two are the same statistic when the level is the mean).

    Parameters
    ----------
    level, ref_level : float
        The statistic of ``|r|`` (nats) of the later version and of the first.
    floor, ref_floor : float
        Their floors (mean ``|d|`` of the trainer's self-check at each version, nats).
    ref_mean : float, optional
        The first version's mean ``|r|`` (nats), the floors' own statistic; None: ``ref_level``.

    Returns
    -------
    float
        The ratio (dimensionless; 1 where the later version sits where its floor predicts).
    """
    c = max((ref_level if ref_mean is None else ref_mean) - ref_floor, 0.0)
    return (max(level, 1e-300) / max(ref_level, 1e-300)) / (max(c + floor, 1e-300) / max(c + ref_floor, 1e-300))


@dataclass(frozen=True)
class VersionThresholds:
    """The bars of :func:`version_excess`, each None for its default in :func:`~rlparity.config.defaults.defaults`
    (read at the call, so :func:`~rlparity.config.defaults.defaults_context` applies).

    Each default's field records what it was calibrated on.

    Parameters
    ----------
    ratio : float, optional
        The ratio to the first version's a version must reach in the median or the mean of ``|r|``;
        None: ``defaults().version_ratio``.
    z : float, optional
        Jackknife standard errors of the log-ratio it must also reach, in that statistic; None:
        ``defaults().version_z``.
    logit_ratio : float, optional
        The ratio the median of ``|r| / (1 - p)`` (:func:`logit_scale`) must reach (with ``z``); None:
        ``defaults().version_logit_ratio``.
    quartile_ratio : float, optional
        The ratio the upper quartile of ``|r|`` (:func:`upper_quartile`) must reach (with ``z``); None:
        ``defaults().version_quartile_ratio``.
    """

    ratio: float | None = None
    z: float | None = None
    logit_ratio: float | None = None
    quartile_ratio: float | None = None

    def resolved(self) -> VersionThresholds:
        """These thresholds with each None replaced by its value in :func:`~rlparity.config.defaults.defaults`.

        Returns
        -------
        VersionThresholds
            Every field a float.
        """
        o = defaults()
        return VersionThresholds(
            ratio=o.version_ratio if self.ratio is None else self.ratio,
            z=o.version_z if self.z is None else self.z,
            logit_ratio=o.version_logit_ratio if self.logit_ratio is None else self.logit_ratio,
            quartile_ratio=o.version_quartile_ratio if self.quartile_ratio is None else self.quartile_ratio)

    def bars(self) -> dict[str, float]:
        """The ratio each statistic of :data:`VERSION_STATISTICS` must reach.

        Returns
        -------
        dict of str to float
            ``ratio`` for the median and the mean, ``logit_ratio`` for the logit median,
            ``quartile_ratio`` for the upper quartile (None where not :meth:`resolved`).
        """
        return {"median": self.ratio, "mean": self.ratio, "logit_median": self.logit_ratio,
                "upper_quartile": self.quartile_ratio}


def version_excess(abs_residual: np.ndarray, free: np.ndarray, policy_version: np.ndarray, *,
                   floors: Mapping[int, float] | None = None, noise: float = float("nan"),
                   fingerprints_equal: Collection[int] = (), scaled: np.ndarray | None = None,
                   thresholds: VersionThresholds | None = None) -> dict[str, Any]:
    """The policy versions whose tokens stand far above the first version's.

    Per policy version with at least 4 free tokens, the median, the mean and the upper quartile
    (:func:`upper_quartile`) of ``|r|`` of them
    (:data:`VERSION_STATISTICS`: the median is robust, as a few tokens of a near-flat distribution
    carry most of the mean, 27x the median on the H200 ``small`` model; the mean sees a partial sync
    that moves few tokens far) and, given ``scaled``, the median of ``|r| / (1 - p)``
    (:func:`logit_scale`: the disagreement read at the logits, whatever the confidence of the
    version's tokens), each measured against that version's own floor where ``floors`` holds
    one for every such version (:func:`floor_excess_ratio`: the first version's mean above its floor
    plus the later version's floor, over the first version's mean, scales every statistic), so a
    version whose weights merely have a higher numeric floor is not flagged. A later version whose
    ratio to the first version's reaches its statistic's bar and whose log-ratio is ``z`` standard
    errors above 0 (:class:`VersionThresholds`), in any statistic, is flagged;
    the error is a delete-a-group jackknife over sequences (tokens of one sequence are not independent
    draws), and with fewer than ``defaults().min_fit_sequences`` sequences holding the two versions' tokens
    nothing is flagged. A version in ``fingerprints_equal`` is never flagged. A trainer whose
    run-to-run ``noise`` is a quarter of the first version's median ``|r|`` or more leaves the test
    untestable.

    Parameters
    ----------
    abs_residual : numpy.ndarray
        ``|r|`` per token (nats), ``(sequence, ...)``.
    free : numpy.ndarray
        Bool, the shape of ``abs_residual``: the tokens no other cause explains (NaN ``|r|`` is left
        out as well).
    policy_version : numpy.ndarray
        The policy version of each token, the shape of ``abs_residual``.
    floors : Mapping[int, float], optional
        Per version, its floor (mean ``|d|`` of the trainer's self-check at it, nats); without one for
        every version tested the ratios are plain ratios of ``|r|``.
    noise : float, default NaN
        The trainer's run-to-run mean ``|d|`` (nats); NaN when not measured.
    fingerprints_equal : collection of int, default ()
        The versions whose engine and trainer fingerprints were both recorded and agree.
    scaled : numpy.ndarray, optional
        ``|r| / (1 - p)`` per token (:func:`logit_scale`), the shape of ``abs_residual``; None: the
        logit statistic is not tested.
    thresholds : VersionThresholds, optional
        The ratios and the z to reach; None (or a None field): the defaults.

    Returns
    -------
    dict
        Mean and median ``|r|`` and token count per version, the ``reference_version``, each later
        version's ratio to it (``version_<v>_over_reference``, over the floors when measured against
        them: ``floor_by_version``) and its ``z_by_version``, the same for the mean
        (``mean_over_reference_by_version``, ``mean_z_by_version``) and the logit statistic
        (``logit_median_over_reference_by_version``, ``logit_median_z_by_version``) and the upper quartile
        (``upper_quartile_over_reference_by_version``, ``upper_quartile_z_by_version``), the versions whose
        fingerprints agree (``fingerprints_equal``), the thresholds, the ``flagged`` versions and which
        statistics flagged them (``flagged_by``); ``untestable`` and no flag when the trainer's noise is too
        large; empty with fewer than two versions of 4 free tokens.
    """
    th = (thresholds or VersionThresholds()).resolved()
    floors = dict(floors or {})
    pv, absr = np.asarray(policy_version), np.asarray(abs_residual)
    free = np.asarray(free, dtype=bool) & np.isfinite(absr)
    stats = _version_stats(absr, free, pv)
    early = _untestable(stats, noise)
    if early is not None:
        return early
    ref = min(stats)
    same = [v for v in stats if v in fingerprints_equal]
    # each version against its own floor, where one was measured for every version (else no floor)
    own_floor = all(v in floors for v in stats)
    out = _version_table(stats, ref, floors, own_floor, same, th)
    for v in [v for v in stats if v != ref]:
        tests = _version_tests(absr, free, pv, scaled, v, ref, floors, own_floor)
        _record_version(out, v, tests, th, same)
    return out


def _version_stats(absr: np.ndarray, free: np.ndarray, pv: np.ndarray) -> dict[int, tuple[float, float, int]]:
    """Per version with at least 4 free tokens, in order: the mean and median ``|r|`` and the count."""
    stats = {}
    for v in sorted({int(x) for x in np.unique(pv[free])}):
        a = absr[free & (pv == v)]
        if a.size >= MIN_VERSION_TOKENS:
            stats[v] = (float(a.mean()), float(np.median(a)), int(a.size))
    return stats


def _untestable(stats: dict[int, tuple[float, float, int]], noise: float) -> dict[str, Any] | None:
    """The result of :func:`version_excess` when nothing can be tested: empty with fewer than two
    versions, ``untestable`` with a trainer too noisy; None when the versions can be tested."""
    if len(stats) < 2:
        return {}
    ref = min(stats)
    # a trainer that does not repeat itself (dropout) moves every version's residual by its own noise: the medians
    # then compare noise, not weights (CPU stability runs: 7 of 10 false claims were dropout arms)
    if np.isfinite(noise) and noise >= 0.25 * stats[ref][1]:
        return {"untestable": f"the trainer's run-to-run noise ({noise:.3g} nats) is a quarter of version {ref}'s "
                              f"median |r| ({stats[ref][1]:.3g}) or more", "flagged": []}
    return None


def _version_table(stats: dict[int, tuple[float, float, int]], ref: int, floors: dict[int, float], own_floor: bool,
                   same: list[int], th: VersionThresholds) -> dict[str, Any]:
    """The result of :func:`version_excess` before its per-version tests: the levels per version, the
    reference, the thresholds, the floors and the versions whose fingerprints agree."""
    out: dict[str, Any] = {"abs_residual_mean_by_version": {str(v): s[0] for v, s in stats.items()},
                           "abs_residual_median_by_version": {str(v): s[1] for v, s in stats.items()},
                           "n_tokens_by_version": {str(v): s[2] for v, s in stats.items()},
                           "reference_version": ref, "ratio_threshold": th.ratio, "z_threshold": th.z,
                           "logit_ratio_threshold": th.logit_ratio,
                           "statistic": "median, mean and upper quartile of |r| and median |r| / (1 - p) per version against the first "
                                        "version's, each over what its own floor predicts (floor_excess_ratio, the "
                                        "floor's share from the means); z from a jackknife over sequences; any one flags",
                           "z_by_version": {}, "flagged": []}
    if floors:
        out["floor_by_version"] = {str(v): f for v, f in floors.items()}
        out["measured_against"] = "each version's own floor" if own_floor else \
            "the first version's level (a floor is missing for some version)"
    if same:
        out["fingerprints_equal"] = same
    out["quartile_ratio_threshold"] = th.quartile_ratio
    return out


def _version_tests(absr: np.ndarray, free: np.ndarray, pv: np.ndarray, scaled: np.ndarray | None, v: int, ref: int,
                   floors: dict[int, float], own_floor: bool) -> dict[str, tuple[float, float]]:
    """Per statistic of :data:`VERSION_STATISTICS` (the logit ones given ``scaled``), version ``v``'s
    log-ratio to ``ref`` and its z (a jackknife over sequences; NaN with too few sequences holding
    the two versions' tokens)."""
    o = defaults()
    statistics = {k: f for k, f in VERSION_STATISTICS.items() if scaled is not None or k not in LOGIT_STATISTICS}
    both = free & ((pv == v) | (pv == ref))
    n_seq = int(both.reshape(both.shape[0], -1).any(axis=1).sum())
    tests = {}
    for name, reduce in statistics.items():

        def log_ratio_of(m, v=v, reduce=reduce, logit=name in LOGIT_STATISTICS):
            a, b = absr[m & (pv == v)], absr[m & (pv == ref)]
            if a.size == 0 or b.size == 0:
                return float("nan")
            # the floor model's c from the mean of the first version's |r| (the floors' statistic), in every statistic
            lr = float(np.log(floor_excess_ratio(reduce(a), reduce(b), floors[v], floors[ref],
                                                 ref_mean=float(np.mean(b)))
                              if own_floor else max(reduce(a), 1e-300) / max(reduce(b), 1e-300)))
            if logit:  # the same floor model, on the statistic read at the logits: swap the plain levels' ratio
                sa, sb = scaled[m & (pv == v)], scaled[m & (pv == ref)]
                lr += float(np.log(max(reduce(sa), 1e-300) / max(reduce(sb), 1e-300))
                            - np.log(max(reduce(a), 1e-300) / max(reduce(b), 1e-300)))
            return lr

        lr = log_ratio_of(free)
        se = core.jackknife_slope_se(log_ratio_of, both, groups=o.jackknife_groups)["se"]
        if n_seq < o.min_fit_sequences:
            se = float("nan")
        # an excess without spread (every left-out group gives the same ratio) is as sure as it gets: z = +inf
        tests[name] = (lr, lr / se if np.isfinite(se) and se > 0
                       else float(np.copysign(np.inf, lr)) if se == 0 and lr != 0 else float("nan"))
    return tests


def _record_version(out: dict[str, Any], v: int, tests: dict[str, tuple[float, float]], th: VersionThresholds,
                    same: list[int]) -> None:
    """Write version ``v``'s ratios and z into ``out`` and flag it where any statistic reaches its
    ratio (:meth:`VersionThresholds.bars`) and ``th.z`` (never a version in ``same``)."""
    lr, zz = tests["median"]
    out[f"version_{v}_over_reference"] = float(np.exp(lr))
    out["z_by_version"][str(v)] = zz
    for name in ("mean", "logit_median", "upper_quartile"):
        if name in tests:
            out.setdefault(f"{name}_over_reference_by_version", {})[str(v)] = float(np.exp(tests[name][0]))
            out.setdefault(f"{name}_z_by_version", {})[str(v)] = tests[name][1]
    bars = th.bars()
    passed = [n for n, (lr_, z_) in tests.items() if np.exp(lr_) >= bars[n] and not np.isnan(z_) and z_ >= th.z]
    if passed and v not in same:
        out["flagged"].append(v)
        out.setdefault("flagged_by", {})[str(v)] = passed


__all__ = ["LOGIT_Q_MIN", "LOGIT_STATISTICS", "MIN_VERSION_TOKENS", "VERSION_STATISTICS", "VersionThresholds", "floor_excess_ratio",
           "logit_scale", "upper_quartile", "version_excess"]
