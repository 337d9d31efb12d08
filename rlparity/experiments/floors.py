"""Floors: what parity can be on this hardware.

:func:`floor_run` captures prompts once with a real vLLM engine, measures the engine's own batch
spread (:func:`rlparity.capture.floor.engine_floor`), and rescores the same tokens under the trainer
shapes real trainers use (:data:`SHAPES`: batch 1 / 16 / 64, packed rows, shuffled micro-batches,
train mode, eager attention, gradient checkpointing, and rlparity's batch-invariant mode). Every arm
is the same rollout with the trainer side of one shape; :func:`rlparity.metrics.floors.floor_table`
puts each shape's floor beside the backend gap, and the diagnosis reads the floors of every arm
(``trainer_not_batch_invariant``, ``engine_not_batch_invariant``).

From a shell: ``rlparity floor MODEL`` (or ``python -m rlparity.experiments.floors --out DIR``; on a GPU
host ``--device cuda --dtype bfloat16``, with ``--shape 1.5b`` for a random model of Qwen2-1.5B's
shape built on the device).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.config.settings import EngineSettings, SamplingSettings, TrainerSettings

# name -> Scorer batch size and TrainerSettings fields
SHAPES: dict[str, dict[str, Any]] = {
    "batch1": {"batch_size": 1},
    "batch16": {"batch_size": 16},
    "batch64": {"batch_size": 64},
    "packed16": {"batch_size": 16, "layout": "packed"},
    "shuffled16": {"batch_size": 16, "order": "shuffled"},
    "train16": {"batch_size": 16, "train_mode": True},
    "eager16": {"batch_size": 16, "attn_implementation": "eager"},
    "checkpointing16": {"batch_size": 16, "gradient_checkpointing": True},
    "batch_invariant": {"batch_invariant": True},
    # the same mode with the sequences in another order: its floor against batch_invariant is the
    # mode's own (0 when the kernels are deterministic at a fixed shape)
    "batch_invariant_shuffled": {"batch_invariant": True, "order": "shuffled"},
}
REFERENCE = "batch1"


def scorer_for(model: str, shape: Mapping[str, Any], *, dtype: str, device: str, head_dtype: str = "float32"):
    """The :class:`~rlparity.score.Scorer` of one trainer shape (:data:`SHAPES` entry)."""
    from rlparity.score import Scorer

    spec = dict(shape)
    batch = spec.pop("batch_size", 16)
    return Scorer(model, dtype=dtype, head_dtype=head_dtype, device=device, batch_size=batch, progress=False,
                  settings=TrainerSettings(**spec))


def floor_run(model: str | os.PathLike, prompts: Sequence, sampling: SamplingSettings | None = None, *,
              shapes: Mapping[str, Mapping[str, Any]] | None = None, engine: EngineSettings | None = None,
              dtype: str = "float32", device: str = "cpu", probe: int = 4,
              log: Callable[[str], None] = print) -> dict[str, xr.Dataset]:
    """Capture ``prompts`` once (an offline engine: processed logprobs, fp32 head, the body in
    ``dtype``), probe the engine's batch spread on ``probe`` of them, and rescore the rollout under
    every trainer shape; returns ``{shape: scored trace}`` (the engine floor in every arm's attrs)."""
    from rlparity.capture import Engine
    from rlparity.capture.floor import engine_floor
    from rlparity.capture.pool import shared_pool

    shapes = dict(shapes or SHAPES)
    sampling = sampling or SamplingSettings(temperature=0.7, top_k=20, max_tokens=32, seed=0)
    settings = engine or EngineSettings(logprobs_mode="processed_logprobs", head_dtype="float32", dtype=dtype,
                                        generation_config="vllm", enable_prefix_caching=False)
    shared_pool().close()
    with Engine(str(model), settings) as eng:
        rollout = eng.capture(list(prompts), sampling, arm="floors", progress=False)
        floor = engine_floor(eng, list(prompts)[:probe], sampling, rollout)
        log(f"captured {rollout.sizes['sequence']} sequences; engine batch spread "
            f"{floor['batch_shape']['mean_abs']:.3g} nats mean |x|")
    rollout.attrs["engine_floor"] = floor
    arms = {}
    for name, shape in shapes.items():
        t0 = time.perf_counter()
        scored = scorer_for(str(model), shape, dtype=dtype, device=device).score(rollout)
        scored.attrs.update({"arm": name, "floor_shape": name})
        arms[name] = scored
        log(f"  {name}: scored in {time.perf_counter() - t0:.2f} s")
    return arms


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlparity.experiments.floors --out DIR``: the floor run, ``DIR/floors.json`` (the
    table, the findings) and the store (``--example NAME``: a compact example store)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m rlparity.experiments.floors", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=None, help="local checkpoint; default: --shape, else the built-in --size")
    p.add_argument("--size", default="tiny", help="built-in trained model (tiny, tiny-bf16, small)")
    p.add_argument("--shape", default=None, help="a random model of a real shape built on the device (1.5b, 7b)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="body dtype on both sides")
    p.add_argument("--n-prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--shapes", default=None, help="comma list of shapes (default: all of SHAPES)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--example", default=None, help="save a compact example store DIR/NAME.zarr")
    a = p.parse_args(argv)
    from rlparity.config.provenance import write_json
    from rlparity.diagnose import diagnose
    from rlparity.experiments.gallery import provenance
    from rlparity.metrics import table_records
    from rlparity.metrics.floors import floor_table
    from rlparity.models import make_model, make_prompts, make_shape_model
    from rlparity.trace import save

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = {"device": a.device} if a.device != "cpu" else {}
    if a.model:
        model = a.model
    elif a.shape:
        model = str(make_shape_model(a.shape, dtype=a.dtype, **dev))  # under $RLPARITY_CACHE, not in --out
    else:
        model = str(make_model(a.size, progress=False, **dev))
    shapes = {k: SHAPES[k] for k in a.shapes.split(",")} if a.shapes else SHAPES
    if REFERENCE not in shapes:
        shapes = {REFERENCE: SHAPES[REFERENCE], **shapes}
    engine = EngineSettings(logprobs_mode="processed_logprobs", head_dtype="float32", dtype=a.dtype,
                            generation_config="vllm", enable_prefix_caching=False,
                            **({"gpu_memory_utilization": a.gpu_memory_utilization} if a.gpu_memory_utilization else {}))
    t0 = time.perf_counter()
    arms = floor_run(model, make_prompts(a.n_prompts), SamplingSettings(temperature=0.7, top_k=20,
                     max_tokens=a.max_tokens, seed=0), shapes=shapes, engine=engine, dtype=a.dtype, device=a.device)
    table = floor_table(arms, REFERENCE)
    invariant = None
    if {"batch_invariant", "batch_invariant_shuffled"} <= set(arms):
        from rlparity.metrics.floors import trainer_floor

        f = trainer_floor(arms["batch_invariant"], arms["batch_invariant_shuffled"])
        invariant = {k: float(f[k]) for k in f.data_vars}
    report = diagnose(arms, title="floors")
    label = a.shape or Path(model).name
    write_json(out / "floors.json", {"model": label, "device": a.device, "dtype": a.dtype,
                                     "table": table_records(table), "engine_floor": table.attrs.get("engine_floor"),
                                     "batch_invariant_mode_floor": invariant,
                                     "shapes": table.attrs["shapes"], "headlines": report.summary_lines(),
                                     "findings": [f.to_dict() for f in report if f.name.endswith("batch_invariant")],
                                     "elapsed_s": round(time.perf_counter() - t0, 1)})
    if a.example:
        from rlparity.datasets import save_example

        cmd = "python -m rlparity.experiments.floors " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
        store = save_example(arms, out / f"{a.example}.zarr", provenance(a.device, label, cmd, "floors: one rollout "
                             "rescored under the trainer shapes real trainers use, with the engine's batch spread"))
    else:
        store = save(arms, out / "floors.zarr")
    print(table[["floor_mean_abs", "floor_max_abs", "share_of_gap", "relative_throughput"]].to_dataframe().round(6))
    print(f"backend gap (mean |d|, {REFERENCE}): {float(table['gap_mean_abs_d']):.4g}; engine batch spread: "
          f"{(table.attrs.get('engine_floor') or {}).get('batch_shape')}")
    print(f"wrote {store} and {out / 'floors.json'}")
    return 0


__all__ = ["REFERENCE", "SHAPES", "floor_run", "main", "scorer_for"]


if __name__ == "__main__":
    raise SystemExit(main())
