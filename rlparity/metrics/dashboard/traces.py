"""The peers by name (:data:`DASHBOARDS`, :data:`SOURCES`, each peer's options) and their
dashboards: of a trace (:func:`as_dashboard`, one arm streamed in one dask computation when it is
lazy) or of plain arrays (:func:`peer_metrics`), as a :class:`DashboardMetrics`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.provenance import make_attrs
from rlparity.metrics.floors import floors_beside_gap
from rlparity.trace import arm_record
from rlparity.trace.storage.lazy.reading import ensure_validated, load_variable
from rlparity.metrics.objective import POLICY_NAMES, policy_logprob, policy_variable
from rlparity.metrics.dashboard.formulas import _evaluate
from rlparity.metrics.dashboard.peers import (
    nemo_rl_metrics,
    pipelinerl_metrics,
    prime_rl_metrics,
    slime_metrics,
    trl_metrics,
)
from rlparity.metrics.dashboard.verl import verl_metrics

DASHBOARDS = ("verl", "pipelinerl", "prime-rl", "slime", "trl", "nemo-rl")

SOURCES = {
    "verl": "verl-project/verl verl/trainer/ppo/rollout_corr_helper.py @ 20c30bf8 "
            "(compute_offpolicy_metrics, compute_is_metrics, compute_rollout_rejection_mask, compute_rs_metrics); "
            "verl/utils/debug/metrics.py @ 0c2766b8 (calculate_debug_metrics)",
    "pipelinerl": "ServiceNow/PipelineRL pipelinerl/finetune/rl/__init__.py @ 005a1f17 (rl_step stats), "
                  "pipelinerl/finetune/rl/utils.py (aggregate_rl_stats), finetune_loop (rl/ess)",
    "prime-rl": "PrimeIntellect-ai/prime-rl src/prime_rl/trainer/rl/loss.py and train.py @ 559b4477 "
                "(compute_importance_ratio_and_mismatch_kl, default_loss_fn, mismatch_kl/all stats)",
    "slime": "THUDM/slime slime/backends/megatron_utils/loss.py @ 624b824a (train_rollout_logprob_abs_diff, "
             "sum_of_sample_mean in cp_utils.py)",
    "trl": "huggingface/trl trl/trainer/grpo_trainer.py @ f2cd5771 (vllm_importance_sampling_correction)",
    "nemo-rl": "NVIDIA-NeMo/RL nemo_rl/algorithms/loss/loss_functions.py @ 7ea279ab (ClippedPGLossFn), "
               "nemo_rl/algorithms/utils.py (calculate_kl)",
}


class DashboardMetrics(dict):
    """A flat ``{peer metric name: value}`` dict that also says what it was computed on: ``peer``,
    ``pair``, ``direction``, ``n_tokens`` used, ``n_excluded`` tokens, ``source``.

    Parameters
    ----------
    values : mapping
        ``{peer metric name: value}``.
    **info : Any
        Keyword arguments: what the numbers were computed on (``peer``, ``pair``, ...).
    """

    def __init__(self, values: Mapping[str, float], **info: Any):
        super().__init__(values)
        self.info = dict(info)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.info[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dataset(self) -> xr.Dataset:
        """The same numbers as an ``xarray.Dataset`` of scalars, provenance in attrs.

        Returns
        -------
        xarray.Dataset
            Scalars, provenance in attrs.
        """
        ds = xr.Dataset({k: ((), float(v)) for k, v in self.items()})
        ds.attrs = make_attrs(**{k: (v if isinstance(v, (str, int, float)) else str(v))
                                 for k, v in self.info.items()})
        return ds


_N_TOKENS, _N_EXCLUDED, _GAP = "__n_tokens", "__n_excluded", "__gap"  # as_dashboard's own, beside the peer's
_FUNCS = {"verl": verl_metrics, "pipelinerl": pipelinerl_metrics, "prime-rl": prime_rl_metrics,
          "slime": slime_metrics, "trl": trl_metrics, "nemo-rl": nemo_rl_metrics}
_OPTIONS = {"verl": {"rollout_is", "rollout_is_threshold", "rollout_rs"},
            "pipelinerl": {"policy_loss", "epsilon_low", "epsilon_high"},
            "prime-rl": {"advantages", "dppo_mask_low", "dppo_mask_high"},
            "slime": set(),
            "trl": {"vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
                    "vllm_importance_sampling_clip_max"},
            "nemo-rl": {"kl_type"}}


def _check_peer(names: str, options: Mapping[str, Any]) -> None:
    if names not in _FUNCS:
        raise ValueError(f"names={names!r}; use one of {list(DASHBOARDS)}")
    unknown = sorted(set(options) - _OPTIONS[names])
    if unknown:
        raise ValueError(f"{names} has no option {unknown}; its options: {sorted(_OPTIONS[names]) or 'none'}")


def peer_metrics(names: str, log_train, log_rollout, mask, **options: Any) -> dict[str, float]:
    """One peer's dashboard metrics from plain arrays: the formulas of :func:`as_dashboard` without a
    trace (what a training loop holds per step, e.g. :class:`rlparity.record.Recorder`).

    Parameters
    ----------
    names : str
        The peer, one of :data:`DASHBOARDS`.
    log_train : numpy.ndarray
        The trainer side's log-probabilities, ``(sequence, position)`` (nats).
    log_rollout : numpy.ndarray
        The rollout's (mu) log-probabilities, same shape.
    mask : numpy.ndarray
        Boolean, real tokens; tokens where either side is not finite are left out.
    **options : Any
        Keyword arguments, the peer's own knobs (as :func:`as_dashboard`; prime-rl ``advantages``).

    Returns
    -------
    dict[str, float]
        ``{peer metric name: value}``.

    Raises
    ------
    ValueError
        ``names`` is no peer, an option is not the peer's, or no token is usable.
    """
    _check_peer(names, options)
    return _FUNCS[names](log_train, log_rollout, mask, **options)


def as_dashboard(trace: xr.Dataset, names: str = "verl", *, trainer: TrainerSide | None = None, policy: str = "old",
                 as_dataset: bool = False, **options: Any) -> DashboardMetrics | xr.Dataset:
    """The trace's mismatch under one peer's dashboard names, with that peer's formulas.

    ``policy="old"`` compares pi_old with mu (the backend pair: what every peer logs on the first
    micro-batch at lag 0); ``policy="theta"`` uses pi_theta (after :func:`rlparity.train.train_step`;
    for prime-rl and PipelineRL, whose "trainer"/"new" side is the current weights, that is what
    they log after an update). A peer logs one number per batch, so a dashboard is a function of
    the whole arm (no ``dim=``; select sequences first, or see :func:`rlparity.metrics.summary`). A lazy trace is streamed in one
    dask computation, its chunks CRC-checked against the store's record in the same pass.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy (``open_arms(store, chunks=N)``).
    names : str
        The peer, one of :data:`DASHBOARDS` (see each ``<peer>_metrics``).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    policy : {"old", "theta"}
        The trainer reading that stands in for the peer's.
    as_dataset : bool
        Return an ``xarray.Dataset`` instead of the flat dict.
    **options : Any
        Keyword arguments, the peer's own knobs (e.g. verl ``rollout_is="sequence"``, ``rollout_rs={"token_k3": 0.3}``;
        TRL ``vllm_importance_sampling_mode``; prime-rl ``advantages``, default the trace's
        ``advantage``).

    Returns
    -------
    DashboardMetrics or xarray.Dataset
        A flat dict of the peer's names with ``pair``, ``direction``, ``n_tokens``,
        ``n_excluded`` and ``source`` on ``.info`` (``as_dataset=True``: an ``xarray.Dataset``).
    """
    _check_peer(names, options)
    if policy not in ("old", "theta"):
        raise ValueError(f"policy={policy!r}; use 'old' (pi_old, the backend pair) or 'theta' (pi_theta)")
    trainer = trainer or defaults().trainer
    # a lazy trace stays lazy: the peer's formulas, the counts and the gap below are dask
    # reductions evaluated together in one pass over the chunks (in memory: numpy, as before),
    # once its arm was validated whole as the eager open validates it (the first read only)
    ensure_validated(trace)
    mask = trace["response_mask"].data.astype(bool)
    log_pi = policy_logprob(trace, policy, trainer, lazy=True)
    log_mu = policy_logprob(trace, "mu", trainer, lazy=True)
    usable = mask & np.isfinite(log_pi) & np.isfinite(log_mu)
    if names == "prime-rl" and "advantages" not in options and "advantage" in trace:
        adv = load_variable(trace, "advantage")  # one value per sequence, CRC-checked: small whatever the size
        if np.isfinite(adv).all():
            options = {**options, "advantages": adv}
    values = _FUNCS[names](log_pi, log_mu, mask, _lazy=True, **options)
    n_used = usable.sum()
    gap = np.where(usable, np.abs(log_pi - log_mu), 0.0).sum() / np.maximum(n_used, 1)
    read = ("response_mask", policy_variable(policy, trainer), policy_variable("mu", trainer))
    values = _evaluate({**values, _N_TOKENS: n_used, _N_EXCLUDED: (mask & ~usable).sum(),
                        _GAP: np.where(n_used > 0, gap, np.nan)}, trace, read)
    n_tokens, n_excluded, gap = int(values.pop(_N_TOKENS)), int(values.pop(_N_EXCLUDED)), values.pop(_GAP)
    pair = f"{'backend' if policy == 'old' else 'bypass'} ({POLICY_NAMES[policy]}, mu)"
    out = DashboardMetrics(values, peer=names, pair=pair,
                           direction=f"{policy_variable(policy, trainer)} - rollout_logprob",
                           n_tokens=n_tokens, n_excluded=n_excluded,
                           source=SOURCES[names], trainer_side=trainer,
                           options=str({k: v for k, v in options.items() if k != "advantages"}),
                           arm=arm_record(trace).name,
                           # beside the peer's numbers: the gap the trainer's own batch shape produces
                           **floors_beside_gap(trace, gap, trainer))
    return out.to_dataset() if as_dataset else out


__all__ = ["DASHBOARDS", "SOURCES", "DashboardMetrics", "as_dashboard", "peer_metrics"]
