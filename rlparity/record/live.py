"""A step's live metrics and alarms, from the arrays a training loop holds (numpy only).

Metrics come from the existing definitions, never copies: rlparity's parity summary
(:func:`rlparity.metrics.summary.token_statistics`, names prefixed ``rlparity/``), the peers'
dashboards (:func:`rlparity.metrics.dashboard.peer_metrics`, the peers' own names), the lag
(:func:`rlparity.metrics.core.lag.lag_stats`) and the ESS (:func:`rlparity.metrics.core.mismatch.ess`). The pair
is the backend pair (pi_old, mu), ``d = log pi_old - log mu``; ``rlparity/update/*`` is the update
pair (pi_theta, pi_old) where the loop gives pi_theta.

Alarms (:data:`ALARMS`; thresholds from ``defaults().record``, ``defaults().objective`` and
``defaults().check``):

``confident_disagreement`` (error)
    a token the engine gave at least ``confident_prob`` that the trainer, scoring it with the
    weights that generated it, puts more than ``confident_gap`` nats lower;
``floor_jump`` (warning)
    the step's mean ``|d|`` above ``floor_jump_ratio`` x the trailing median of the steps before
    (and above ``floor_jump_min``);
``gap_above_gate`` (warning)
    mean ``|d|`` or k3 above ``rlparity check``'s gates;
``weights_unchanged`` (error)
    the engine's weight digest at this sync equals the one before although the trainer stepped;
``scored_by_older_version`` (error)
    tokens whose pi_old came from older weights than the ones that generated them;
``ess_low`` (warning) / ``ess_collapse`` (error)
    the normalised ESS of the token ratios pi_old/mu or of the sequences' geometric ratios below
    ``objective.ess_min`` / ``objective.ess_collapse``;
``staleness`` (warning)
    a token more than ``max_lag`` versions behind the trainer;
``ratio_offset`` (error)
    the mean of ``pi_old / mu`` over the trailing ``ratio_window`` steps is more than ``ratio_z``
    jackknife errors from 1 (:func:`pooled_ratio_offset`) and outside ``rlparity check``'s
    ``mean_ratio`` band. Tokens drawn from mu give
    ``E[pi/mu] = sum pi = 1`` for any normalised pi_old, whatever the kernels, precision, lag or
    weights: the test is of mu itself, that it is the distribution the engine sampled from. An
    engine reporting raw (temperature-1) logprobs while sampling the processed distribution q has
    ``E_q[q / p] = sum q^2 / p > 1``. One step holds too few sequences to tell (a 128-token TRL step:
    clean z -3.0..1.4, raw 2.0..7.6), so the steps of a window are pooled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlparity.config.defaults import Defaults
from rlparity.metrics import core
from rlparity.metrics.dashboard.traces import peer_metrics
from rlparity.metrics.summary import token_statistics

PREFIX = "rlparity/"
ALARMS: dict[str, str] = {
    "confident_disagreement": "error",
    "floor_jump": "warning",
    "gap_above_gate": "warning",
    "weights_unchanged": "error",
    "scored_by_older_version": "error",
    "ess_low": "warning",
    "ess_collapse": "error",
    "staleness": "warning",
    "ratio_offset": "error",
}
LEVELS = {"warning": 1, "error": 2}


@dataclass(frozen=True)
class Alarm:
    """One alarm of one step.

    Parameters
    ----------
    code : str
        One of :data:`ALARMS`.
    level : {"warning", "error"}
        How bad.
    step : int
        The step (its index in the run store).
    value : float
        What was measured.
    threshold : float
        What it was compared with.
    message : str
        One line: what happened and what to check.
    """

    code: str
    level: str
    step: int
    value: float
    threshold: float
    message: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.level} {self.code}: {self.message}"


@dataclass(frozen=True)
class StepArrays:
    """One step as padded float64 / int arrays ``(sequence, position)``, the input of :func:`step_metrics`.

    Parameters
    ----------
    log_mu : numpy.ndarray
        The engine's logprobs (NaN on padding).
    log_pi : numpy.ndarray
        The trainer's pi_old.
    mask : numpy.ndarray
        Boolean, real tokens.
    policy_version : numpy.ndarray
        The version that generated each token.
    scored_version : numpy.ndarray
        The version whose weights gave each token's pi_old.
    trainer_version : int
        The trainer's version at this step.
    log_theta : numpy.ndarray, optional
        pi_theta.
    rewards : numpy.ndarray, optional
        One per sequence.
    advantages : numpy.ndarray, optional
        One per sequence.
    prompt_index : numpy.ndarray, optional
        The prompt (group) of each sequence: the jackknife's unit of :func:`ratio_units`.
    """

    log_mu: np.ndarray
    log_pi: np.ndarray
    mask: np.ndarray
    policy_version: np.ndarray
    scored_version: np.ndarray
    trainer_version: int
    log_theta: np.ndarray | None = None
    rewards: np.ndarray | None = None
    advantages: np.ndarray | None = None
    prompt_index: np.ndarray | None = None


def digest_change(previous: Mapping[str, int] | None, current: Mapping[str, int] | None) -> float:
    """The share of tensors whose checksum changed between two syncs (over the tensors both hold).

    Parameters
    ----------
    previous : Mapping[str, int], optional
        The digest at the sync before.
    current : Mapping[str, int], optional
        The digest now.

    Returns
    -------
    float
        In [0, 1]; NaN when either is missing or they share no tensor.
    """
    if not previous or not current:
        return float("nan")
    common = set(previous) & set(current)
    if not common:
        return float("nan")
    return sum(previous[n] != current[n] for n in common) / len(common)


def ratio_units(log_mu: np.ndarray, log_pi: np.ndarray, mask: np.ndarray,
                prompt_index: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A step's sums for :func:`pooled_ratio_offset`, per unit of the jackknife: the sequences of one
    prompt (a GRPO group shares its prompt, so its samples are not independent), or each sequence.

    Parameters
    ----------
    log_mu, log_pi : numpy.ndarray
        ``(sequence, position)``: the engine's mu and the trainer's pi_old (nats).
    mask : numpy.ndarray
        Boolean, real tokens.
    prompt_index : numpy.ndarray, optional
        One per sequence; ``None``: every sequence is its own unit.

    Returns
    -------
    tuple of numpy.ndarray
        ``(sum of pi_old/mu - 1, tokens)`` per unit holding tokens with a finite ``d``.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        d = log_pi - log_mu
        ok = core.finite_mask(d, mask)
        excess = np.where(ok, np.expm1(np.where(ok, d, 0.0)), 0.0).sum(axis=1)
    n = ok.sum(axis=1)
    unit = np.arange(len(n)) if prompt_index is None else np.asarray(prompt_index)
    keys, inv = np.unique(unit, return_inverse=True)
    s_u, n_u = np.bincount(inv, excess, len(keys)), np.bincount(inv, n, len(keys))
    keep = n_u > 0
    return s_u[keep], n_u[keep]


def pooled_ratio_offset(units: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """``mean(pi_old / mu) - 1`` over the tokens of several steps, with its delete-one-unit
    jackknife standard error (units: :func:`ratio_units`) and ``z = offset / se``.

    Parameters
    ----------
    units : sequence of tuple of numpy.ndarray
        :func:`ratio_units` of each step pooled.

    Returns
    -------
    dict[str, float]
        ``offset``, ``se``, ``z``, ``units`` and ``tokens``; NaN with fewer than 2 units.
    """
    s = np.concatenate([u[0] for u in units]) if units else np.zeros(0)
    n = np.concatenate([u[1] for u in units]).astype(float) if units else np.zeros(0)
    g, total = len(s), float(n.sum())
    nan = float("nan")
    if g < 2:
        return {"offset": nan, "se": nan, "z": nan, "units": float(g), "tokens": total}
    offset = float(s.sum() / total)
    rest = n.sum() - n
    with np.errstate(invalid="ignore", divide="ignore"):
        leave = (s.sum() - s) / rest  # the offset without each unit
    if not np.all(rest > 0):
        return {"offset": offset, "se": nan, "z": nan, "units": float(g), "tokens": total}
    se = float(np.sqrt((g - 1) / g * np.sum((leave - leave.mean()) ** 2)))
    z = offset / se if se > 0 else (0.0 if offset == 0 else float("inf") * np.sign(offset))
    return {"offset": offset, "se": se, "z": float(z), "units": float(g), "tokens": total}


class RatioWindow:
    """The ``ratio_offset`` alarm's trailing window: the :func:`ratio_units` of the last ``steps``
    steps, pooled with the current step's by :func:`pooled_ratio_offset`.

    Parameters
    ----------
    steps : int
        The steps the window holds (``defaults().record.ratio_window``).
    """

    def __init__(self, steps: int):
        self.units: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=steps)

    def restore(self, group: Any, old_var: str, k: int) -> None:
        """Read the window's steps back from a run store's committed steps (their tokens).

        Parameters
        ----------
        group : zarr.Group
            The run store's group.
        old_var : str
            The variable holding the trainer's pi_old.
        k : int
            The committed steps: the window ends before step ``k``.
        """
        g = group
        for j in range(max(0, k - self.units.maxlen), k):
            n = int(g["n_sequences"][j])
            lengths = np.asarray(g["response_length"][j, :n])
            width = max(1, int(lengths.max(initial=0)))
            mask = np.arange(width)[None, :] < lengths[:, None]
            self.units.append(ratio_units(np.asarray(g["rollout_logprob"][j, :n, :width], np.float64),
                                          np.asarray(g[old_var][j, :n, :width], np.float64), mask,
                                          np.asarray(g["prompt_index"][j, :n])))

    def with_step(self, a: StepArrays) -> tuple[deque[tuple[np.ndarray, np.ndarray]], dict[str, float]]:
        """The window with this step pooled in, not yet kept (:meth:`keep`, once the step is recorded).

        Parameters
        ----------
        a : StepArrays
            The step.

        Returns
        -------
        window : collections.deque
            The trailing steps' units and this step's.
        metrics : dict[str, float]
            The pooled offset's metrics (``rlparity/ratio_offset_window``, ``_z``, ``_units``, ``_steps``).
        """
        window = deque(self.units, maxlen=self.units.maxlen)
        window.append(ratio_units(a.log_mu, a.log_pi, a.mask, a.prompt_index))
        pooled = pooled_ratio_offset(list(window))
        return window, {PREFIX + "ratio_offset_window": pooled["offset"], PREFIX + "ratio_offset_z": pooled["z"],
                        PREFIX + "ratio_offset_units": pooled["units"], PREFIX + "ratio_offset_steps": float(len(window))}

    def keep(self, window: deque[tuple[np.ndarray, np.ndarray]]) -> None:
        """Make ``window`` the trailing window.

        Parameters
        ----------
        window : collections.deque
            The window :meth:`with_step` returned.
        """
        self.units = window


def step_metrics(a: StepArrays, *, eps: float, dashboards: Sequence[str]) -> dict[str, float]:
    """The step's metrics under rlparity's names (``rlparity/...``) and the peers' dashboard names.

    Parameters
    ----------
    a : StepArrays
        The step.
    eps : float
        The PPO clip range of ``clip_fraction``.
    dashboards : sequence of str
        Peers whose names to add (:data:`rlparity.metrics.DASHBOARDS`).

    Returns
    -------
    dict[str, float]
        Name to value (NaN where a metric has no token to use).
    """
    m = a.mask
    out: dict[str, float] = {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for k, v in token_statistics(a.log_pi, a.log_mu, m, eps=eps).items():
            out[PREFIX + k] = float(v)
        d = np.where(m, a.log_pi - a.log_mu, np.nan)
        usable = core.finite_mask(d, m)
        seq_ok = m.any(axis=1) & ~(m & ~usable).any(axis=1)  # every real token of the sequence usable
        dz = np.where(usable, d, 0.0)
        total = dz.sum(axis=1)
        length = np.maximum(m.sum(axis=1), 1)
        geo = total / length
        # ESS is scale-free: shift the log weights by their max (no overflow; raw, untruncated weights)
        for name, logw in (("ess_sequence", total), ("ess_geometric", geo)):
            top = np.max(np.where(seq_ok, logw, -np.inf)) if seq_ok.any() else 0.0
            out[PREFIX + name] = float(core.ess(np.exp(logw - top), seq_ok)) if seq_ok.any() else float("nan")
        lag = core.token_lag(a.policy_version, m, latest=a.trainer_version)
        for k, v in core.lag_stats(lag, m).items():
            if k != "n_tokens":
                out[PREFIX + k] = float(v)
        out[PREFIX + "scored_by_older_tokens"] = float((m & (a.scored_version >= 0)  # negative: unknown
                                                     & (a.scored_version < a.policy_version)).sum())
        if a.rewards is not None:
            out[PREFIX + "reward_mean"] = float(np.nanmean(a.rewards)) if np.isfinite(a.rewards).any() else float("nan")
        if a.log_theta is not None:
            upd = token_statistics(a.log_theta, a.log_pi, m, eps=eps)
            for k in ("abs_log_ratio_mean", "kl_k3", "clip_fraction", "ess_token"):
                out[PREFIX + "update/" + k] = float(upd[k])
        if usable.any():
            for peer in dashboards:
                options = {}
                if peer == "prime-rl" and a.advantages is not None and np.isfinite(a.advantages).all():
                    options["advantages"] = a.advantages
                out.update(peer_metrics(peer, a.log_pi, a.log_mu, m, **options))
    return out


def confident_disagreements(a: StepArrays, prob: float, gap: float) -> tuple[int, float]:
    """Tokens the engine gave at least ``prob`` that the trainer, at the weights that generated them,
    puts more than ``gap`` nats lower (probability 0 included).

    Parameters
    ----------
    a : StepArrays
        The step.
    prob : float
        The engine's probability at least.
    gap : float
        Nats the trainer is lower by more than.

    Returns
    -------
    tuple[int, float]
        Their count, and the largest ``log mu - log pi_old`` among them (NaN when none).
    """
    with np.errstate(invalid="ignore"):
        own = (a.scored_version == a.policy_version) & (a.policy_version >= 0)  # negative: unknown
        lower = a.log_mu - a.log_pi  # +inf where the trainer gives probability 0
        hit = a.mask & own & np.isfinite(a.log_mu) & (a.log_mu >= np.log(prob)) & ~np.isnan(a.log_pi) & (lower > gap)
    n = int(hit.sum())
    return n, float(np.max(lower[hit])) if n else float("nan")


def step_alarms(step: int, a: StepArrays, metrics: Mapping[str, float], *, history: Sequence[float],
                weights_changed: float, trainer_stepped: bool, d: Defaults, digest_stride: int = 1) -> list[Alarm]:
    """The alarms of one step (:data:`ALARMS`).

    Parameters
    ----------
    step : int
        The step's index.
    a : StepArrays
        The step.
    metrics : Mapping[str, float]
        Its metrics (:func:`step_metrics`).
    history : sequence of float
        Mean ``|d|`` of the steps before (the trailing window).
    weights_changed : float
        :func:`digest_change` against the sync before (NaN: nothing to compare).
    trainer_stepped : bool
        Whether this is a newer version's sync than the one before (the trainer stepped).
    d : Defaults
        The thresholds (``defaults()``).
    digest_stride : int, default 1
        The digests checksummed every ``digest_stride``-th value (said in the message: a sampled
        digest misses a change of values it did not sample).

    Returns
    -------
    list[Alarm]
        The alarms that fired.
    """
    r, o, c = d.record, d.objective, d.check
    out: list[Alarm] = []

    def fire(code: str, value: float, threshold: float, message: str, level: str | None = None) -> None:
        out.append(Alarm(code, level or ALARMS[code], step, float(value), float(threshold), message))

    n, worst = confident_disagreements(a, r.confident_prob, r.confident_gap)
    if n:
        fire("confident_disagreement", n, r.confident_gap,
             f"{n} tokens the engine gave >= {r.confident_prob:g} are scored by the trainer up to {worst:.3g} nats "
             f"lower (> {r.confident_gap:g}) with the same weights: the engine and the trainer do not run the same "
             "model (weights not synced, stale prefix cache, wrong logprobs mode)")
    gap = metrics.get(PREFIX + "abs_log_ratio_mean", float("nan"))
    hist = np.asarray(history[-r.floor_window:], float)
    if len(hist) >= r.floor_min_steps and np.isfinite(gap):
        med = float(np.median(hist))
        if gap > r.floor_jump_ratio * med and gap > r.floor_jump_min:
            fire("floor_jump", gap, r.floor_jump_ratio * med,
                 f"mean |log pi_old - log mu| {gap:.3g} nats is {gap / max(med, 1e-300):.3g}x the median {med:.3g} of "
                 f"the {len(hist)} steps before: something changed in the engine or the trainer at this step")
    k3 = metrics.get(PREFIX + "kl_k3", float("nan"))
    over_gap = c.max_abs_log_ratio_mean is not None and gap > c.max_abs_log_ratio_mean
    if over_gap or (c.max_kl_k3 is not None and k3 > c.max_kl_k3):
        value, threshold = (gap, c.max_abs_log_ratio_mean) if over_gap else (k3, c.max_kl_k3)
        fire("gap_above_gate", value, threshold,
             f"mean |d| {gap:.3g} nats (gate {c.max_abs_log_ratio_mean}), k3 {k3:.3g} (gate {c.max_kl_k3}): above "
             "rlparity check's gates; run `rlparity diagnose` on this step's trace (rlparity.record.step_trace)")
    if trainer_stepped and weights_changed == 0.0:
        what = ("no bf16 value" if digest_stride == 1 else
                f"no sampled bf16 value (1 value in {digest_stride} of each tensor; a handful of values elsewhere may "
                "have moved)")
        fire("weights_unchanged", 0.0, 0.0,
             "the engine's weight digest equals the previous sync's although the trainer stepped: the update "
             f"did not reach the engine (or moved {what}: a float32 trainer with a tiny step)")
    older = metrics.get(PREFIX + "scored_by_older_tokens", 0.0)
    if older > 0:
        fire("scored_by_older_version", older, 0,
             f"{int(older)} tokens were scored (pi_old) by older weights than the ones that generated them: "
             "recompute pi_old after the sync, or score each token at its own version")
    finite = [v for v in (metrics.get(PREFIX + "ess_token"), metrics.get(PREFIX + "ess_geometric"))
              if v is not None and np.isfinite(v)]
    ess = min(finite) if finite else float("nan")
    if ess < o.ess_collapse:
        fire("ess_collapse", ess, o.ess_collapse,
             f"normalised ESS of the importance weights pi_old/mu is {ess:.3g} (< {o.ess_collapse:g}): a few "
             "tokens or sequences carry the batch")
    elif ess < o.ess_min:
        fire("ess_low", ess, o.ess_min, f"normalised ESS of pi_old/mu is {ess:.3g} (< {o.ess_min:g})")
    z, units = metrics.get(PREFIX + "ratio_offset_z", float("nan")), metrics.get(PREFIX + "ratio_offset_units", 0.0)
    off = metrics.get(PREFIX + "ratio_offset_window", float("nan"))
    band = c.mean_ratio  # and outside rlparity check's band: a bias too small to matter is no alarm, however sure
    outside = band is None or not band[0] <= 1.0 + off <= band[1]
    if units >= r.ratio_min_units and abs(z) > r.ratio_z and outside:
        fire("ratio_offset", z, r.ratio_z,
             f"mean pi_old/mu over the last {int(metrics.get(PREFIX + 'ratio_offset_steps', 0))} steps is 1{off:+.3g}, "
             f"{z:+.1f} jackknife errors from 1 ({int(units)} prompt groups): the engine's logprobs mu are not the "
             "distribution it sampled from (vLLM's raw_logprobs mode, or temperature / top-k / top-p not applied "
             "to the logprobs returned)")
    lag = metrics.get(PREFIX + "lag_max", float("nan"))
    if lag > r.max_lag:
        fire("staleness", lag, r.max_lag,
             f"tokens up to {lag:g} versions behind the trainer (> {r.max_lag}); share off-policy "
             f"{metrics.get(PREFIX + 'offpolicy_share', float('nan')):.3g}")
    return out


__all__ = ["ALARMS", "Alarm", "LEVELS", "PREFIX", "RatioWindow", "StepArrays", "confident_disagreements", "digest_change",
           "pooled_ratio_offset", "ratio_units", "step_alarms", "step_metrics"]
