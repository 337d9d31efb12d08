"""Per-layer divergence on a GPU (issue 25): every scenario that must be located, on real vLLM
engines with a bf16 body, in one command; results written after every step.

On the H200 host (vLLM 0.26, the project on PYTHONPATH):

    export RLPARITY_ENGINE_LOCK=off VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn
    python scripts/gpu_layers.py --out $OUT --device cuda

What it does (about 3-4 minutes: the built-in ``small`` model trained on the device, three engine
starts of 30-70 s):

1. builds ``small`` on the device (``make_model("small", device="cuda")``; bf16 on both sides);
2. runs :func:`rlparity.experiments.layers.run_layers` with every scenario: ``clean`` (and the
   floor on other prompts), ``trainer_bf16_head``, ``partial_weight_sync`` (layer 1 left out of
   the update; the live weight check on it), ``stale_prefix_cache`` on the first engine;
   ``batch_variant_attention`` (``TRITON_ATTN`` instead of the default backend) and
   ``rollout_bf16_head`` on engines of their own. Every engine runs **eagerly**
   (``enforce_eager=True``): forward hooks added after start-up do not fire inside CUDA graphs, so
   the profiles describe vLLM's eager path, not its default compiled one;
3. after every arm, writes ``$OUT/layers_results.json`` (where each arm starts to diverge, its
   relative error and ratio to the floor, the cause named, the live weight checks, the floors,
   what did not run and why, versions, seconds); at the end packs the compact store
   ``$OUT/layers.tar.gz`` (``layers.zarr``: every arm, its layer profile, floats as float32; root
   attrs ``example`` with the provenance; to ship as example data ``h200-layers``) and draws
   ``$OUT/layers_profile.html``.

``--ci``: the same on this CPU with the tiny model (float32), for a test run of the script.
A scenario that fails is recorded and the others go on; engines stop starting after
``--budget`` seconds (default 170), so the command ends within about 4 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as _platform
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def versions() -> dict:
    out = {"python": _platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    for mod in ("vllm", "torch", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as err:  # noqa: BLE001 - a record, not a requirement
            out[mod] = f"unavailable ({type(err).__name__})"
    try:
        import torch

        if torch.cuda.is_available():
            out["device_name"] = torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001
        pass
    return out


def summarize(arms) -> dict:
    """Per arm: where it starts to diverge (or how close to its floor it stays), and why."""
    from rlparity.diagnose.layers import divergence_start

    out = {}
    for name, ds in arms.items():
        try:
            f = divergence_start(ds.assign_attrs(arm=name))
        except Exception as err:  # noqa: BLE001
            out[name] = {"error": f"{type(err).__name__}: {err}"}
            continue
        e = f.evidence
        out[name] = {"finding": f.name, "cause": f.cause, "site": e.get("site"), "layer": e.get("layer"),
                     "module": e.get("module"), "relative_error": e.get("relative_error", e.get("max_relative_error")),
                     "ratio_to_floor": e.get("ratio_to_floor", e.get("max_ratio_to_floor")),
                     "floor": e.get("floor"), "max_relative_error_before": e.get("max_relative_error_before"),
                     "first_position": e.get("first_position"), "cached_positions": e.get("cached_positions"),
                     "position_0_over": e.get("position_0_over"), "comparison": e.get("comparison"),
                     "summary": f.summary}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for layers_results.json, layers.tar.gz, layers_profile.html")
    p.add_argument("--device", default="cuda")
    p.add_argument("--ci", action="store_true", help="the tiny model on this CPU, float32 (a test run)")
    p.add_argument("--size", default=None, help="built-in model (default: small; tiny with --ci)")
    p.add_argument("--n-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--sigma", type=float, default=0.2, help="relative size of the update to version 1")
    p.add_argument("--budget", type=float, default=170.0, help="no engine starts after this many seconds (an H200 start "
                   "takes 30-70 s: 170 keeps the command within about 4 minutes)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "layers_results.json"
    # checkpoints and the unpacked store stay out of --out (only the results, the tar and the figure go back)
    work = Path(tempfile.mkdtemp(prefix="gpu-layers-work-"))
    t_start = time.perf_counter()
    device = "cpu" if a.ci else a.device
    size = a.size or ("tiny" if a.ci else "small")
    dtype = "float32" if a.ci else "bfloat16"
    command = "python scripts/gpu_layers.py " + " ".join(sys.argv[1:] if argv is None else argv)
    results: dict = {"command": command, "device": device, "model": size, "body_dtype": dtype, **versions(),
                     "status": "running", "arms": {}, "steps": []}

    def write() -> None:
        from rlparity.config.provenance import to_json

        results["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        tmp = results_path.with_suffix(".tmp")
        tmp.write_text(to_json(results, indent=1))
        os.replace(tmp, results_path)

    write()
    arms: dict = {}
    try:
        from rlparity.experiments.layers import LayerSettings, run_layers
        from rlparity.models import make_model

        t0 = time.perf_counter()
        model = make_model(size, device=device, progress=False)
        results["steps"].append({"step": "model", "path": str(model), "seconds": round(time.perf_counter() - t0, 1)})
        write()
        engine = {} if a.ci else {"gpu_memory_utilization": a.gpu_memory_utilization}
        settings = LayerSettings(n_prompts=a.n_prompts, max_tokens=a.max_tokens, sigma=a.sigma, device=device,
                                 dtype=dtype, engine=engine)

        def on_arm(name, trace, record):
            arms[name] = trace
            results["arms"].update(summarize({name: trace}))
            results["record"] = record
            results["steps"].append({"step": name, "elapsed_s": round(time.perf_counter() - t_start, 1)})
            write()

        budget = max(a.budget - (time.perf_counter() - t_start), 0.0)
        _, record = run_layers(model, None, settings, workdir=work / "checkpoints", on_arm=on_arm, deadline_s=budget,
                               log=lambda m: print(m, flush=True))
        results["record"] = record
        results["status"] = "done"
    except Exception as err:  # noqa: BLE001 - keep what was measured
        results["status"] = f"failed: {type(err).__name__}: {err}"
        results["traceback"] = traceback.format_exc()[-4000:]
    write()
    if arms:
        try:
            pack(arms, out, work, results)
        except Exception as err:  # noqa: BLE001
            results["pack"] = f"failed: {type(err).__name__}: {err}"
        write()
    print(json.dumps({k: results[k] for k in ("status", "elapsed_s")}, indent=1))
    for name, r in results["arms"].items():
        print(f"{name:36} {str(r.get('site') or '(within floor)'):16} {str(r.get('cause') or ''):24} "
              f"rel {r.get('relative_error')}")
    return 0 if results["status"] == "done" else 1


def pack(arms, out: Path, work: Path, results: dict) -> None:
    """The compact store (``layers.zarr`` in ``layers.tar.gz``) and the profile figure."""
    import shutil

    import xarray as xr

    from rlparity.config.provenance import jsonable
    from rlparity.datasets import KEEP, compact
    from rlparity.metrics.layers import profile_table
    from rlparity.plot.layers import plot_layer_profile
    from rlparity.trace import save
    from rlparity.trace.layers import LAYER_VARS

    store = work / "layers.zarr"
    if store.exists():
        shutil.rmtree(store)
    tree = xr.DataTree.from_dict({a: compact(ds, keep=KEEP + tuple(LAYER_VARS)) for a, ds in arms.items()})
    tree.attrs["example"] = {
        "description": "per-layer divergence (issue 25): clean, partial weight sync (layer 1 left out), stale prefix "
                       "cache, bf16 LM head on either side, another attention backend; each arm profiled against the "
                       "trainer and, for engine-side scenarios, against the clean engine (eager path)",
        "device": results["device"], "device_name": results.get("device_name", _platform.processor() or "cpu"),
        "vllm": results.get("vllm"), "torch": results.get("torch"), "transformers": results.get("transformers"),
        "date": results["date"], "model": results["model"], "command": results["command"]}
    tree.attrs["layers_summary"] = jsonable(results["arms"], strict=True)
    save(tree, store)
    with tarfile.open(out / "layers.tar.gz", "w:gz") as tar:
        tar.add(store, arcname="layers.zarr")
    results["store"] = {"tar": "layers.tar.gz", "bytes": (out / "layers.tar.gz").stat().st_size}
    fig = plot_layer_profile(profile_table(arms))
    fig.write_html(out / "layers_profile.html", include_plotlyjs=True)


if __name__ == "__main__":
    raise SystemExit(main())
