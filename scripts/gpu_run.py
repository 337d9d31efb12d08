"""Run rlparity's GPU parts on a GPU host in one call, each part in its own process with its own time
limit, and pack what each wrote into one archive per part (the device tool brings back at most 8
files, two folders deep).

    python3 scripts/gpu_run.py --out $OUT faults gpu_tests

Parts (add one by adding a line to PARTS): each is a command run from the project root with
``{out}`` (its own output folder) and ``{card}`` (``h100``, ``h200``: the example data are named after the
card that ran them) filled in. A part that fails or runs past its limit is recorded
in ``$OUT/gpu_run.json`` with its exit code and the tail of its log; the others still run.
Environment the host needs (the bundle in ../shared/gpu): ``PYTHONPATH`` with the bundle and the
project, ``VLLM_USE_FLASHINFER_SAMPLER=0``, ``VLLM_WORKER_MULTIPROC_METHOD=spawn``,
``RLPARITY_ENGINE_LOCK=off``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

PY = sys.executable
# the experiments run through the CLI with tracebacks (--debug) and vLLM's log lines in the part's log
# (--engine-logs: on stderr, not in a file under runs/logs)
CLI = "--debug --engine-logs"
PARTS: dict[str, tuple[str, int]] = {
    # the H200 fault matrix (issue 21): the bf16 `small` model, every single cause and every pair of
    # eight, shipped as example data h200-faults
    # (requests in flight across the update run 128 tokens and the update lands after 10% of them: with
    # the default 32 tokens every request had finished before the pause on the H200, nothing carried)
    "faults": (f"{PY} -m rlparity {CLI} experiment faults --out {{out}} --size small --dtype bfloat16 --device cuda "
               "--sigma 0.2 --n-prompts 8 --max-tokens 32 --inflight-tokens 128 --update-after 0.1 "
               "--example h200-faults && rm -rf {out}/checkpoints", 400),
    # floors (issue 24): one rollout rescored under every trainer shape, the engine's batch spread; the
    # trained bf16 `small` and a random model of Qwen2-1.5B's shape built on the device
    "floors": (f"{PY} -m rlparity {CLI} experiment floors --out {{out}}/small --size small --dtype bfloat16 "
               "--device cuda --n-prompts 64 --max-tokens 64 --example h200-floors-small", 200),
    # the 1.5B shape alone (with the small model in one part it ran past 330 s in the batch-invariant rows)
    "floors_1p5b": (f"{PY} -m rlparity {CLI} experiment floors --out {{out}}/1p5b --shape 1.5b --dtype bfloat16 "
                    "--device cuda --n-prompts 64 --max-tokens 64 --gpu-memory-utilization 0.6 "
                    "--example h200-floors-1p5b", 370),
    # the arms with KV carried over an update again, with requests long enough to be in flight at the pause
    "faults_kv": (f"{PY} -m rlparity {CLI} experiment faults --out {{out}} --size small --dtype bfloat16 --device cuda "
                  "--sigma 0.2 --n-prompts 8 --max-tokens 32 --inflight-tokens 128 --update-after 0.1 --example "
                  "h200-faults-kv --arms clean,kv_carried_over,raw_logprobs+kv_carried_over,trainer_temperature"
                  "+kv_carried_over,sampling_penalty+kv_carried_over,trainer_bf16_head+kv_carried_over,"
                  "stale_prefix_cache+kv_carried_over,kv_carried_over+partial_weight_sync,"
                  "kv_carried_over+trainer_dropout && rm -rf {out}/checkpoints", 240),
    # the CUDA paths of the Scorer, compile_head, train_step, make_model (issue 22)
    "gpu_tests": (f"{PY} -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py", 150),
    # per-layer divergence (issue 25): the scenarios located on the bf16 `small`, shipped as h200-layers
    "layers": (f"{PY} scripts/gpu_layers.py --out {{out}} --device cuda", 270),
    "layers_bench": (f"{PY} benchmarks/layer_capture.py --shape 1.5b --device cuda --out {{out}}/layer_capture_h200.json",
                     170),
    # mixture of experts (issue 26): small-moe's routes on vLLM 0.26, replay, the dense comparison
    "moe": (f"{PY} scripts/gpu_moe.py --out {{out}} --device cuda --budget-s 330", 560),
    # chapter 2 (issue 28): the one-knob ablation on the bf16 `small` with the knobs the CPU build cannot run
    # (async scheduling, cascade attention, another attention kernel, batch-invariant kernels), shipped as
    # h100-ablation (named after the card that ran it); knobs whose engine would start after 430 s keep their row, marked as not run
    "ablation": (f"{PY} -m rlparity {CLI} experiment ablation --out {{out}} --size small --dtype bfloat16 "
                 "--device cuda --knobs async_scheduling,cascade_attention,attention_backend,batch_invariant,eager,"
                 "prefix_caching,max_num_seqs,chunked_prefill --n-prompts 32 --max-tokens 64 --batch-sizes 1,2,4,8,16,32 "
                 "--budget-s 430 "
                 "--gpu-memory-utilization 0.5 --example h100-ablation", 560),
    # the two knobs the H100 run's budget left out (max_num_seqs, chunked prefill), with their own reference
    # arm in the same run; shipped as {card}-ablation-queue
    "ablation_queue": (f"{PY} -m rlparity {CLI} experiment ablation --out {{out}} --size small --dtype bfloat16 "
                       "--device cuda --knobs max_num_seqs,chunked_prefill --n-prompts 32 --max-tokens 64 "
                       "--batch-sizes 1,2,4,8,16,32 --budget-s 330 --gpu-memory-utilization 0.5 "
                       "--example {card}-ablation-queue", 450),
    # chapter 5 (issue 28): raw vs processed captures, one step, token TIS + a mask on the raw trace, shipped
    # as h100-objective: the tiny model of the CPU section (the trained `small` solves 99.9% of its prompts at
    # T=0.7, which left one group of eight with an advantage), the body in float32 on both sides as in the
    # h200-rl run (a bf16 step at a small lr rounds away)
    "objective": (f"{PY} -m rlparity {CLI} experiment objective --out {{out}} --size tiny --dtype float32 "
                  "--device cuda --n-prompts 64 --n-samples 8 --max-tokens 48 --lr 1e-4 "
                  "--gpu-memory-utilization 0.5 --example {card}-objective", 400),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("parts", nargs="+", choices=sorted(PARTS))
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {"python": sys.version, "parts": {}}
    try:
        import torch

        record["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no cuda"
        record["torch"] = torch.__version__
    except Exception as err:  # noqa: BLE001
        record["device"] = f"torch not importable: {err}"
    name_of_card = str(record.get("device", "")).upper()
    card = next((c.lower() for c in ("H200", "H100", "B200", "A100") if c in name_of_card), "gpu")
    for name in a.parts:
        cmd, limit = PARTS[name]
        part_dir = out / f"{name}_files"
        part_dir.mkdir(parents=True, exist_ok=True)
        log = out / f"{name}.log"
        t0 = time.perf_counter()
        with open(log, "w") as fh:
            # its own process group, so a part past its limit takes its engine's processes with it (the
            # next part needs the GPU memory)
            proc = subprocess.Popen(cmd.format(out=part_dir, card=card), shell=True, stdout=fh, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = 124
        tail = log.read_text(errors="replace")[-3000:]
        record["parts"][name] = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1), "log_tail": tail}
        with tarfile.open(out / f"{name}.tar.gz", "w:gz") as tar:
            tar.add(part_dir, arcname=name)
            tar.add(log, arcname=f"{name}/{name}.log")
        for f in sorted(part_dir.rglob("*"), reverse=True):  # keep $OUT to the archives
            f.unlink() if f.is_file() else f.rmdir()
        part_dir.rmdir()
        log.unlink()
        (out / "gpu_run.json").write_text(json.dumps(record, indent=1))
        print(f"{name}: rc {rc} in {record['parts'][name]['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
