"""The three policies and their pairs on a trace (xarray): which variable holds each policy, a
pair's direction and its per-token log-ratio ``d``, read whole or one block of whole sequences at
a time.

A lazy trace (``rlparity.trace.open_arms(store, chunks=N)``) is read through
:func:`rlparity.trace.blocks` (each block validated, the store's CRC-32 record checked once the
last is read); per-sequence values of the blocks are concatenated in block order. The reductions
over these blocks are :mod:`~rlparity.metrics.objective.traces`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.metrics.objective.arrays import ValueWithCounts, logprob_difference, sequence_log_ratio
from rlparity.metrics.objective.settings import Kind, PairName
from rlparity.trace import blocks, is_lazy

POLICY_VARIABLES = {
    "processed": {"mu": "rollout_logprob", "old": "trainer_processed_logprob",
                  "theta": "trainer_updated_processed_logprob"},
    "raw": {"mu": "rollout_logprob", "old": "trainer_logprob", "theta": "trainer_updated_logprob"},
}
PAIRS: dict[str, tuple[str, str]] = {"backend": ("old", "mu"), "update": ("theta", "old"),
                                     "bypass": ("theta", "mu")}
POLICY_NAMES = {"mu": "mu", "old": "pi_old", "theta": "pi_theta"}
_NEEDS = {"old": "run rlparity.score(trace, model) first",
          "theta": "run rlparity.train.train_step(model, trace) first (it adds pi_theta)"}
DIMS = ("sequence", "position")


def policy_variable(policy: str, trainer: TrainerSide | None = None) -> str:
    """The trace variable holding one policy's log-probabilities.

    Parameters
    ----------
    policy : {"mu", "old", "theta"}
        The rollout (mu), the trainer at the rollout's weights (pi_old) or after a step (pi_theta).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    str
        The variable's name, e.g. ``"trainer_processed_logprob"``.
    """
    trainer = trainer or defaults().trainer
    if trainer not in POLICY_VARIABLES:
        raise ValueError(f"trainer={trainer!r}; use 'processed' or 'raw'")
    if policy not in POLICY_VARIABLES[trainer]:
        raise ValueError(f"policy={policy!r}; use 'mu', 'old' or 'theta'")
    return POLICY_VARIABLES[trainer][policy]


def policy_logprob(trace: xr.Dataset, policy: str, trainer: TrainerSide | None = None, *,
                   lazy: bool = False) -> np.ndarray:
    """The per-token log-probabilities of ``policy`` as a float array (NaN on padding).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    policy : {"mu", "old", "theta"}
        The policy (see :func:`policy_variable`).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    lazy : bool
        Keep a lazy trace lazy: a dask array (nothing read) for a formula that streams.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``(sequence, position)`` log-probabilities (nats).
    """
    var = policy_variable(policy, trainer)
    if var not in trace:
        raise ValueError(f"the trace has no {var} ({POLICY_NAMES[policy]}): {_NEEDS.get(policy, '')}")
    if lazy:
        return np.where(trace["response_mask"].data.astype(bool), trace[var].data.astype(float), np.nan)
    return np.where(trace["response_mask"].values.astype(bool), trace[var].values.astype(float), np.nan)


def available_pairs(trace: xr.Dataset, trainer: TrainerSide | None = None) -> list[str]:
    """The pairs whose two policies the trace holds.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    list of str
        Names among :data:`PAIRS`, in its order.
    """
    have = {p for p in ("mu", "old", "theta") if policy_variable(p, trainer) in trace}
    return [name for name, (a, b) in PAIRS.items() if a in have and b in have]


def pair_direction(pair: str, trainer: TrainerSide | None = None) -> dict[str, str]:
    """attrs naming a pair and its direction.

    Parameters
    ----------
    pair : {"backend", "update", "bypass"}
        The pair of policies.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    dict
        ``pair`` (e.g. ``"backend (pi_old, mu)"``), ``direction`` (e.g.
        ``"trainer_processed_logprob - rollout_logprob"``) and ``trainer_side``.
    """
    if pair not in PAIRS:
        raise ValueError(f"pair={pair!r}; use one of {list(PAIRS)}")
    trainer = trainer or defaults().trainer
    num, den = PAIRS[pair]
    return {"pair": f"{pair} ({POLICY_NAMES[num]}, {POLICY_NAMES[den]})",
            "direction": f"{policy_variable(num, trainer)} - {policy_variable(den, trainer)}",
            "trainer_side": trainer}


def pair_log_ratio(trace: xr.Dataset, pair: PairName = "backend", trainer: TrainerSide | None = None
                   ) -> xr.DataArray:
    """Per-token ``d`` of a pair (nats); NaN on padding.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm (a lazy one is read whole: reduce it with the functions below instead).
    pair : {"backend", "update", "bypass"}
        The pair of policies.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    xarray.DataArray
        ``d``, dims ``(sequence, position)``, pair and direction in its attrs.
    """
    attrs = pair_direction(pair, trainer)
    num, den = PAIRS[pair]
    mask = trace["response_mask"].values.astype(bool)
    d = logprob_difference(policy_logprob(trace, num, trainer), policy_logprob(trace, den, trainer), mask)
    return xr.DataArray(d, dims=DIMS,
                        coords={"sequence": trace["sequence"], "position": trace["position"]},
                        name="log_ratio", attrs={**attrs, "units": "nats",
                                                 "long_name": f"log {POLICY_NAMES[num]} - log {POLICY_NAMES[den]}"})


def trace_blocks(trace: xr.Dataset, *, progress: Callable | None = None,
                 variables: Iterable[str] | None = None) -> Iterator[xr.Dataset]:
    """The trace one block of whole sequences at a time.

    A trace in memory is one block; a lazy trace is read through :func:`rlparity.trace.blocks`
    (its chunk of sequences per block; the arm validated whole once, as the eager open validates
    it; the CRC-32 record of what is read checked after the last block: read every block, or
    nothing is checked).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy.
    progress : callable, optional
        Wraps the block iterator of a lazy trace (e.g. ``tqdm.tqdm``).
    variables : iterable of str, optional
        The variables the caller reads (a lazy trace loads only these once it is validated);
        ``None`` reads all.

    Yields
    ------
    xarray.Dataset
        One block, in memory.
    """
    if is_lazy(trace):
        yield from blocks(trace, progress=progress, variables=variables)
    else:
        yield trace


def pair_variables(pairs: Iterable[str], trainer: TrainerSide | None = None) -> list[str]:
    """The variables the pairs' log-ratios read: the response mask and each policy's logprob.

    Parameters
    ----------
    pairs : iterable of str
        Names among :data:`PAIRS`.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    list of str
        The variable names, without repeats.
    """
    return list(dict.fromkeys(["response_mask"] + [policy_variable(p, trainer) for pair in pairs
                                                   for p in PAIRS[pair]]))


def pair_blocks(trace: xr.Dataset, pair: PairName = "backend", trainer: TrainerSide | None = None, *,
                progress: Callable | None = None) -> Iterator[np.ndarray]:
    """``d`` of a pair one block of whole sequences at a time (:func:`trace_blocks`).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy.
    pair : {"backend", "update", "bypass"}
        The pair of policies.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    progress : callable, optional
        Wraps the block iterator of a lazy trace (e.g. ``tqdm.tqdm``).

    Yields
    ------
    numpy.ndarray
        ``d`` of one block, ``(sequence, position)``, NaN on padding.
    """
    pair_direction(pair, trainer)
    for policy in PAIRS[pair]:
        policy_logprob(trace.isel(sequence=slice(0, 0)), policy, trainer)  # a missing policy: said before reading
    for part in trace_blocks(trace, progress=progress, variables=pair_variables([pair], trainer)):
        yield pair_log_ratio(part, pair, trainer).values


def concat_sequences(parts) -> ValueWithCounts:
    """Per-sequence :class:`~rlparity.metrics.objective.arrays.tokens.ValueWithCounts` of consecutive blocks as one, in block order.

    Parameters
    ----------
    parts : sequence of ValueWithCounts
        One per block: a value, its real tokens and its excluded tokens per sequence.

    Returns
    -------
    ValueWithCounts
        The blocks' arrays concatenated along ``sequence``.
    """
    return ValueWithCounts(*(np.concatenate([np.atleast_1d(p[i]) for p in parts]) for i in range(3)))


def pair_sequences(trace: xr.Dataset, pair: PairName = "backend", trainer: TrainerSide | None = None, *,
                   kind: Kind = "geometric") -> ValueWithCounts:
    """:func:`~rlparity.metrics.objective.arrays.sequence_log_ratio` of every sequence, block by block.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy.
    pair : {"backend", "update", "bypass"}
        The pair of policies.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    kind : {"geometric", "product"}
        ``mean_t d`` (GSPO's ``log s_i``) or ``sum_t d``.

    Returns
    -------
    ValueWithCounts
        One value per sequence (NaN: excluded), its real tokens, its excluded tokens.
    """
    parts = [sequence_log_ratio(d, kind=kind) for d in pair_blocks(trace, pair, trainer)]
    return concat_sequences(parts)
