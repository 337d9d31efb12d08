"""The trainer's own floor: a few sequences of a scoring rescored alone (batch 1), then together in the
trainer's micro-batches twice and once more with a second attention implementation, so a diagnosis can
tell what the batch shape, a second run and the choice of kernel move the trainer's logprobs by from
what separates the trainer from the engine (``attrs["trainer"]["self_check"]``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from rlparity.trace.floor import spread

__all__ = ["self_check"]


def self_check(stats: Callable[..., dict[str, np.ndarray]], seqs: list[tuple[list[int], list[int]]],
               sampling: dict[str, np.ndarray], result: dict[str, np.ndarray], *, k: int, batch_size: int,
               replay: tuple[np.ndarray | None, np.ndarray] | None = None,
               kernel: tuple[str, Callable[[], AbstractContextManager]] | None = None) -> dict[str, Any] | None:
    """The trainer's floor on the first ``k`` sequences with a response: each rescored alone (batch 1),
    then together in the trainer's own micro-batches, twice (and once more with a second attention
    implementation).

    Four passes: ``alone`` (batch 1, against the batched scoring: what the batch shape moves),
    ``grouped`` and ``again`` (the ``k`` sequences in micro-batches of ``batch_size``, twice: what a
    second identical forward moves) and ``kernel`` (the grouped micro-batches under the second
    implementation, against ``grouped``: how far two correct kernels disagree on the same shape, the
    masked or packed kernel the batched scoring runs). Only ``alone`` runs ``k`` forwards; the others
    run ``ceil(k / batch_size)`` each, so on a GPU, where a batch-1 forward costs about what a
    micro-batch does, the check costs about a third of three passes alone.

    Parameters
    ----------
    stats : callable
        ``stats(seqs, batches, sampling, replay=replay)``: the head statistics of the micro-batches
        ``batches`` (the scorer's own forward).
    seqs : list of (list of int, list of int)
        ``(prompt ids, response ids)`` per sequence.
    sampling : dict of str to numpy.ndarray
        The trainer temperature, top-k and top-p per sequence.
    result : dict of str to numpy.ndarray
        The batched scoring's ``(sequence, position)`` statistics.
    k : int
        How many sequences to rescore.
    batch_size : int
        The batched scoring's micro-batch size (recorded; the grouped passes' micro-batches).
    replay : tuple, optional
        The engine's ``(prompt routes, routes)`` forced in the routers, as in the batched scoring.
    kernel : tuple of (str, callable), optional
        ``(what, switch)``: ``switch()`` is a context manager under which the trainer runs a second
        attention implementation (``what`` names the two, recorded); None: no kernel check.

    Returns
    -------
    dict or None
        ``batch_shape_raw`` / ``batch_shape_processed`` (``|batch scoring - alone|``: what the batch
        shape moves) and ``run_to_run_raw`` / ``run_to_run_processed`` (``|grouped - grouped again|``:
        nondeterminism such as dropout or atomics), each :func:`rlparity.trace.floor.spread` in nats,
        with the sequences and shapes; with ``kernel``, ``kernel_raw`` / ``kernel_processed``
        (``|grouped - grouped with the second implementation|``: how far two correct kernels disagree) and
        ``kernel_check`` (``what``); ``pass_s``: the wall seconds of each pass (``alone``, ``grouped``,
        ``again``, ``kernel``), what the check cost the call; None when no sequence has a response.
    """
    pick = [i for i in range(len(seqs)) if seqs[i][1]][:k]
    if not pick:
        return None
    alone = [[i] for i in pick]
    step = max(1, int(batch_size))
    grouped = [pick[i:i + step] for i in range(0, len(pick), step)]
    seconds: dict[str, float] = {}  # each pass ends on the host (stats returns numpy arrays): wall times are whole

    def timed(name: str, batches: list[list[int]]):
        t0 = time.perf_counter()
        res = stats(seqs, batches, sampling, replay=replay)
        seconds[name] = time.perf_counter() - t0
        return res

    first = timed("alone", alone)
    group = timed("grouped", grouped)
    again = timed("again", grouped)
    out: dict[str, Any] = {"sequences": pick, "shape_main": f"micro-batches of up to {batch_size} in the "
                           "scoring's layout and order (attrs trainer.shape)", "shape_check": "batch 1",
                           "shape_run_to_run": f"the {len(pick)} sequences in batches of up to {step}, twice"}
    pairs = [("batch_shape", result, first), ("run_to_run", group, again)]
    if kernel is not None:
        try:
            with kernel[1]():
                pairs.append(("kernel", group, timed("kernel", grouped)))
            out["kernel_check"] = kernel[0]
        except (ValueError, ImportError) as err:  # the model does not support the second implementation
            out["kernel_check"] = f"{kernel[0]}: not run ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    out["pass_s"] = seconds
    for name, a, b in pairs:
        for var, key in (("trainer_logprob", "raw"), ("trainer_processed_logprob", "processed")):
            out[f"{name}_{key}"] = spread(a[var][pick], b[var][pick])
    return out
