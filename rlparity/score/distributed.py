"""Rescoring across processes and GPUs with ``torch.distributed`` (data parallel).

Every rank loads the trainer model (on its own GPU, ``cuda:<local rank>``, or the CPU with the gloo
backend), takes every ``world``-th micro-batch of the single-process plan
(:meth:`rlparity.score.Scorer.compute` with ``shard=(rank, world)``), and the ranks' arrays are
gathered on rank 0, which assembles the scored trace. The micro-batches and their shapes are the
single process's, so the result equals it exactly (what a different batching would move is the
trainer's floor, :mod:`rlparity.metrics.floors`). Only tensors cross between ranks (no pickled
objects).

Run it with torchrun (``rlparity score STORE --model M --nproc N`` starts it)::

    torchrun --nproc-per-node 2 -m rlparity.score.distributed STORE --model M [--out OUT] [--device cuda]

A model too large for one GPU is out of this module's scope: load it sharded with accelerate's
``device_map="auto"`` in one process (:class:`~rlparity.score.Scorer` takes a loaded model).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.settings import TrainerSettings
from rlparity.trace.record import arm_record


def _gather(arrays: dict[str, np.ndarray], rank: int, world: int, device: str) -> dict[str, np.ndarray] | None:
    """Merge every rank's arrays on rank 0 (an entry is set on the rank that scored it: NaN
    elsewhere for floats, -1 for integers); ``None`` on the other ranks."""
    import torch
    import torch.distributed as dist

    out = {} if rank == 0 else None
    for k in sorted(arrays):
        a = arrays[k]
        t = torch.from_numpy(np.ascontiguousarray(a)).to(device)
        parts = [torch.empty_like(t) for _ in range(world)] if rank == 0 else None
        dist.gather(t, parts, dst=0)
        if rank == 0:
            got = [p.cpu().numpy() for p in parts]
            merged = got[0].copy()
            for g in got[1:]:
                take = ~np.isnan(g) if g.dtype.kind == "f" else g != -1
                merged[take] = g[take]
            out[k] = merged
    return out


def score_distributed(trace: xr.Dataset, model: Any, *, settings: TrainerSettings | None = None,
                      dtype: str = "float32", head_dtype: str = "float32", device: str = "cpu",
                      batch_size: int = 16) -> xr.Dataset | None:
    """Score ``trace`` across the ranks of the current process group (see the module docstring).

    Every rank must call it with the same trace, inside an initialised ``torch.distributed``
    process group; rank 0 runs the self-check.

    Parameters
    ----------
    trace : xarray.Dataset
        The rollout trace to score.
    model : str, os.PathLike or transformers model
        The trainer's model, loaded on every rank.
    settings : TrainerSettings, optional
        How the trainer computes its reading; None: the correct way.
    dtype : str, default "float32"
        The body's precision.
    head_dtype : str, default "float32"
        The LM head's precision.
    device : str, default "cpu"
        This rank's torch device (``cuda:<local rank>``, or ``cpu`` with the gloo backend).
    batch_size : int, default 16
        Sequences per forward (the single-process plan's micro-batches).

    Returns
    -------
    xarray.Dataset or None
        The scored trace on rank 0 (with ``attrs["trainer"]["distributed"]``), ``None`` on the
        others.
    """
    import torch.distributed as dist

    from rlparity.score.scorer import Scorer

    rank, world = dist.get_rank(), dist.get_world_size()
    scorer = Scorer(model, dtype=dtype, head_dtype=head_dtype, device=device, batch_size=batch_size,
                    progress=False, settings=settings)
    parts = scorer.compute(trace, shard=(rank, world), self_check=rank == 0)
    merged = _gather(parts["result"], rank, world, "cpu" if device == "cpu" else device)
    if rank != 0:
        return None
    scored = scorer.assemble(trace, {**parts, "result": merged})
    scored.attrs["trainer"] = {**arm_record(scored).scorer.to_attrs(), "distributed": {
        "world_size": world, "backend": dist.get_backend(), "shards": "every world-th micro-batch of the "
        "single-process plan per rank (same batches and shapes)"}}
    return scored


def main(argv: Sequence[str] | None = None) -> int:
    """The command line that torchrun starts: rescore the arms of a store across processes.

    ``torchrun --nproc-per-node N -m rlparity.score.distributed STORE --model M [--out OUT]``.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (``STORE``, ``--model``, ``--out``, ``--arm`` (repeatable), ``--dtype``,
        ``--head-dtype``, ``--device``, ``--batch-size``, ``--trainer`` as TrainerSettings JSON);
        None: ``sys.argv``.

    Returns
    -------
    int
        The exit status, 0.

    Raises
    ------
    ValueError
        If an arm asked for is not in the store, or an arm names no model and ``--model`` is not
        given.
    """
    import argparse

    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser(prog="python -m rlparity.score.distributed", description=__doc__.split("\n")[0])
    p.add_argument("store")
    p.add_argument("--model", default=None, help="trainer model (default: each arm's own)")
    p.add_argument("--out", default=None, help="store to write (default: rescore STORE in place)")
    p.add_argument("--arm", action="append", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--head-dtype", default="float32")
    p.add_argument("--device", default="cpu", help="'cpu' (gloo) or 'cuda' (nccl, one GPU per rank)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--trainer", default=None, help="TrainerSettings as JSON")
    a = p.parse_args(argv)
    from rlparity.trace import arm_record, open_arms, save

    cuda = a.device.startswith("cuda")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        settings = TrainerSettings.model_validate_json(a.trainer) if a.trainer else None
        arms = open_arms(a.store)
        chosen = list(a.arm or arms)
        unknown = [x for x in chosen if x not in arms]
        if unknown:
            raise ValueError(f"no arm(s) {unknown} in {a.store}; it holds {sorted(arms)}")
        for name in chosen:
            m = a.model or arm_record(arms[name]).model
            if not m:
                raise ValueError(f"arm {name!r} names no model: pass --model PATH_OR_HUB_ID")
            scored = score_distributed(arms[name], m, settings=settings, dtype=a.dtype, head_dtype=a.head_dtype,
                                       device=device, batch_size=a.batch_size)
            if scored is not None:
                arms[name] = scored
        if dist.get_rank() == 0:
            save(arms, a.out or a.store)
            print(f"rescored {len(chosen)} arm(s) on {dist.get_world_size()} processes into {a.out or a.store}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


__all__ = ["main", "score_distributed"]


if __name__ == "__main__":
    raise SystemExit(main())
