"""A small online RL run per engine profile: what a backend mismatch does to the curves of a run.

Per profile, :func:`rl_run` starts one real ``AsyncLLM`` (:class:`rlparity.capture.AsyncEngine`)
under that profile and one trainer (transformers, fp32 LM head, AdamW) from the same initial
weights, then loops, for ``steps`` steps:

1. **rollout**: ``n_prompts`` arithmetic prompts x ``n_samples`` samples; the prompts and seeds
   of step k are the same for every profile (:func:`step_prompts`, :func:`step_sampling`);
2. **pi_old**: the trainer's in-memory model rescores every token with the weights that sampled
   it (:func:`rlparity.score.score_versions`; no reload from disk) and with its current weights
   (``trainer_latest_*``: what a trainer that ignores versions sees);
3. **step**: one optimizer step with the objective layer's code (:func:`rlparity.train.train_step`,
   reward :func:`rlparity.train.arithmetic_reward`, advantages normalised over each prompt's
   samples); the optimizer state persists across steps;
4. **update**: the new weights are saved as safetensors and pushed into the running engine with
   the inflight path (:meth:`rlparity.capture.AsyncEngine.update_weights`: pause ``mode`` (keep),
   load through the worker extension, optionally reset the prefix cache, set the policy version
   k+1, resume). Tokens carry the version that sampled them.

Asynchrony (``async_rollouts=True``, PipelineRL-style, one step of lag): the rollouts of step k+1
are started with :meth:`~rlparity.capture.AsyncEngine.capture_async` *before* step k trains, so
the engine samples them with the weights of version k while the trainer computes version k+1; the
update is pushed while they may still be in flight (``keep``: they resume on the new weights;
their tokens carry both versions). Step k+1 then trains on a batch sampled (mostly) by version
k: lag 1. To score those tokens at their own version, the trainer keeps a copy of its weights of
the previous version for one step.

Profiles (:data:`RL_PROFILES`): ``pipelinerl-parity``, ``vllm-v1-defaults`` (raw logprobs, prefix
caching and async scheduling on) and ``parity-bf16-head`` (the parity profile with the rollout LM
head in bf16). The body dtype is pinned to the trainer's on every profile (``dtype``), so the
profiles differ in what they name. One engine runs at a time (each is closed before the next
profile starts).

The loss's ratio denominator (``old_policy``): ``"pi_old"``, the trainer's own reading recomputed
at the sampling weights (verl, slime: the backend mismatch never reaches the update), or ``"mu"``,
the engine's logprobs as they came (PipelineRL, prime-rl: the mismatch enters the clip). Several
denominators run one after the other on each profile's engine, each from the initial weights
(loaded back into the running engine, the prefix cache reset) with a fresh trainer and optimizer;
their runs are named ``<profile>+<old_policy>``.

:func:`rl_run` returns ``{"<run>@step_NNN": trace}`` (labels by :func:`rlparity.metrics.rl.step_arm`;
factors ``profile``, ``old_policy``, ``step`` in each trace's attrs),
each trace scored (pi_old per version, pi_theta, ``reward``, ``advantage``) with what the runner
did and its timings in ``attrs["rl"]``. The curves are computed from those traces by
:func:`rlparity.metrics.rl.rl_curves`, drawn by :func:`rlparity.plot.rl.plot_rl_curves`.

From a shell (one call on a GPU host with ``RLPARITY_ENGINE_LOCK=off``)::

    python -m rlparity.experiments.rl --out DIR [--device cuda] [--steps N] [--async-rollouts] [--flat]

writes ``DIR/rl.json`` (the curves and the contrast with the parity profile; first), then
``DIR/rl.zarr`` (every step's trace) and the same store as flat files, ``DIR/rl.zarr.tar.gz`` (or
``.part00``, ``.part01``... of at most 15 MiB: :func:`pack`), then the findings of every run's first
step (added to ``rl.json``) and ``DIR/rl_curves.csv``; nothing outside ``DIR`` but a temporary
checkpoint folder, removed at the end.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from rlparity.config.defaults import defaults
from rlparity.experiments.rl_example import make_example, pack
from rlparity.experiments.rl_profiles import (
    DERIVED_PROFILES,
    OLD_POLICIES,
    RL_PROFILES,
    rl_profile,
    run_name,
    step_prompts,
    step_sampling,
)
from rlparity.experiments.rl_runner import RLRunSettings, rl_run
from rlparity.experiments.rl_summary import diagnose_first_steps, summarize


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlparity.experiments.rl --out DIR``: run every profile, write the JSON of the
    curves first, then the store of every step's trace, then the curves as CSV."""
    import argparse

    d = defaults().rl
    p = argparse.ArgumentParser(prog="python -m rlparity.experiments.rl", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for rl.json, rl.zarr and rl_curves.csv")
    p.add_argument("--model", default=None, help="local checkpoint (initial weights); default: the built-in model")
    p.add_argument("--size", default="tiny", help="built-in model size when --model is not given")
    p.add_argument("--device", default="cpu", help="the trainer's device (cuda on a GPU host)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--loss", default=d.loss, choices=["gspo", "ppo", "grpo"])
    p.add_argument("--old-policy", action="append", default=None, choices=list(OLD_POLICIES),
                   help="the loss's ratio denominator, one run each (repeat): pi_old recomputed by the trainer, or "
                        "mu (PipelineRL); default: " + " and ".join(d.old_policy))
    p.add_argument("--n-prompts", type=int, default=d.n_prompts)
    p.add_argument("--n-samples", type=int, default=d.n_samples)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--seed", type=int, default=defaults().seed)
    p.add_argument("--profile", action="append", default=None, help="a profile (repeat); default: the three")
    p.add_argument("--async-rollouts", action="store_true", help="generate step k+1 while step k trains (lag 1)")
    p.add_argument("--dtype", default=d.dtype, help="body dtype pinned on the engine and the trainer alike")
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--flat", action="store_true", help="leave only flat files in --out: the store as tar parts "
                                                       "(rl.zarr removed once packed)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    from rlparity.config.provenance import write_json
    from rlparity.metrics import rl as mrl
    from rlparity.models import make_model
    from rlparity.trace import save

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = a.model or str(make_model(a.size, progress=False, device=a.device))
    engine = {"gpu_memory_utilization": a.gpu_memory_utilization} if a.gpu_memory_utilization else {}
    t0 = time.perf_counter()
    arms = rl_run(model, a.profile, a.steps, loss=a.loss, old_policy=a.old_policy, n_prompts=a.n_prompts,
                  n_samples=a.n_samples,
                  max_tokens=a.max_tokens, lr=a.lr, async_rollouts=a.async_rollouts, device=a.device, seed=a.seed,
                  dtype=a.dtype, engine=engine, progress=not a.no_progress)
    elapsed = time.perf_counter() - t0
    res = summarize(arms, findings=False)
    res.update({"model": model, "device": a.device, "elapsed_s": round(elapsed, 1),
                "sizes": {"steps": a.steps, "n_prompts": a.n_prompts, "n_samples": a.n_samples,
                          "max_tokens": a.max_tokens, "lr": a.lr, "loss": a.loss,
                          "old_policy": a.old_policy or list(d.old_policy), "dtype": a.dtype,
                          "async_rollouts": a.async_rollouts},
                "engine_effective": {run: arms[k].attrs.get("engine_effective")
                                     for k, (run, step) in mrl.run_steps(arms).items() if step == 0},
                "store": "rl.zarr"})
    write_json(out / "rl.json", res)  # first: the numbers survive a missing store
    try:
        store = save(arms, out / "rl.zarr")
        res["archive"] = [p.name for p in pack(store, out)]
        res["unpack"] = f"cat {res['archive'][0].split('.part')[0]}* | tar xz  # gives rl.zarr"
        if a.flat:
            shutil.rmtree(store)
            res["store"] = "rl.zarr (packed: see archive and unpack)"
    except ImportError as err:
        res["store"] = f"not written ({err}: install zarr to save the store)"
    try:
        report = diagnose_first_steps(arms)
        res.update({"findings": report.to_dict()["findings"], "verdict": report.verdict})
    except Exception as err:  # noqa: BLE001 - the curves and the store are written; say why the findings are not
        res["findings_error"] = f"{type(err).__name__}: {err}"
    write_json(out / "rl.json", res)
    mrl.rl_curves(arms).to_dataframe().to_csv(out / "rl_curves.csv")
    for prof, c in res["contrast"].items():
        print(f"{prof}: mean ratio at step 0 {c['mean_ratio_step0']:.4f}, max |mean ratio - 1| "
              f"{c['max_abs_mean_ratio_minus_1']:.4f}, clamp indicator {c['clamp_indicator_mean']:.4f} "
              f"({c['clamp_indicator_vs_reference']:.3g}x the reference), reward {c['reward_mean']:.3f} "
              f"(first to last {c['reward_first_to_last']:+.3f})")
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} in {out} ({elapsed:.0f} s of runs)")
    return 0


__all__ = ["DERIVED_PROFILES", "OLD_POLICIES", "RL_PROFILES", "RLRunSettings", "diagnose_first_steps", "main", "make_example", "pack",
           "rl_profile", "rl_run", "run_name", "step_prompts", "step_sampling", "summarize"]


if __name__ == "__main__":
    raise SystemExit(main())
