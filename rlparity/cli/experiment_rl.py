"""``rlparity experiment rl --out DIR``: online RL on the built-in arithmetic task under each engine
profile (:func:`rlparity.experiments.rl.rl_run`); the command builds one
:class:`~rlparity.experiments.rl.RLRunSettings` from its options and passes it down.
"""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from rlparity.cli.common import check_model, device_option, effective_settings, engine_overrides, gpu_memory_option, \
    output_folder, size_option
from rlparity.cli.contract import BadInput, engine_logs, option_defaults

if TYPE_CHECKING:
    from rlparity.experiments.rl import RLRunSettings

_D = option_defaults()
_R = _D.rl


class Loss(str, Enum):
    gspo = "gspo"
    ppo = "ppo"
    grpo = "grpo"


def rl_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="folder for rl.json, rl.zarr and rl_curves.csv"),
    model: Optional[str] = typer.Option(None, help="local checkpoint (initial weights); default: the built-in --size",
                                        callback=check_model),
    size: str = size_option(),
    device: str = device_option(),
    profile: Optional[list[str]] = typer.Option(None, help="engine profile (repeat); default: "
                                                           + ", ".join(_R.profiles)),
    steps: int = typer.Option(_R.steps, min=1, help="optimizer steps per run"),
    loss: Loss = typer.Option(Loss(_R.loss), help="the objective of every step"),
    old_policy: Optional[list[str]] = typer.Option(
        None, help="the loss's ratio denominator, one run each (repeat): pi_old recomputed by the trainer, or the "
                   "engine's mu (PipelineRL); default: " + " and ".join(_R.old_policy)),
    n_prompts: int = typer.Option(_R.n_prompts, min=1, help="prompts per step"),
    n_samples: int = typer.Option(_R.n_samples, min=2, help="samples per prompt (the advantage's group)"),
    max_tokens: int = typer.Option(_R.max_tokens, min=1),
    lr: float = typer.Option(_R.lr, help="AdamW learning rate (> 0)"),
    temperature: float = _D.temperature,
    top_k: int = _D.top_k,
    seed: int = _D.seed,
    async_rollouts: bool = typer.Option(False, "--async-rollouts", help="generate step k+1's rollouts while step k "
                                                                        "trains (lag 1)"),
    dtype: str = typer.Option(_R.dtype, help="body dtype pinned on the engine and the trainer alike"),
    gpu_memory_utilization: Optional[float] = gpu_memory_option(),
    flat: bool = typer.Option(False, "--flat", help="leave only flat files in --out: the store as tar parts "
                                                    "(rl.zarr removed once packed)"),
    no_progress: bool = typer.Option(False, "--no-progress"),
    as_json: bool = typer.Option(False, "--json", help="print rl.json (curves, contrast, findings) as strict JSON"),
    fault: Optional[str] = typer.Option(None, "--fault", help="plant a fault mid-run, from --fault-from-step on: "
                                                              "raw_logprobs (the running engine switched to raw "
                                                              "logprobs; on profiles that report processed ones)"),
    fault_from_step: Optional[int] = typer.Option(None, "--fault-from-step", help="the first step with --fault"),
):
    """Online RL on the built-in arithmetic task, one real AsyncLLM per engine profile: sample, rescore
    pi_old with the trainer, one optimizer step, push the weights into the running engine (pause /
    update / resume). One run per profile and ratio denominator (pi_old recomputed, or the engine's
    mu as PipelineRL uses it), each from the same initial weights and seeds. Writes DIR/rl.json (the
    curves, written first), DIR/rl.zarr (every step's trace, arms <run>@step_NNN, also packed into
    tar parts), DIR/rl_curves.csv; prints each run against the first profile's run of the same
    ratio denominator."""
    engine_logs()
    from rlparity.cli.common import sampling_settings
    from rlparity.experiments.rl import RLRunSettings, rl_run
    from rlparity.models import make_model

    run = RLRunSettings(steps=steps, loss=loss.value, old_policy=old_policy or None, n_prompts=n_prompts,
                        n_samples=n_samples, max_tokens=max_tokens, lr=lr, seed=seed, dtype=dtype,
                        async_rollouts=async_rollouts, device=device, fault=fault, fault_from_step=fault_from_step)
    _rl_check(run, profile, out)  # every refusal before a model is built or --out is made
    sampling = sampling_settings(temperature=temperature, top_k=top_k, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    model = model or str(make_model(size, progress=False, device=device))
    t0 = time.perf_counter()
    arms = rl_run(model, profile or None, settings=run, sampling=sampling, engine=engine_overrides(gpu_memory_utilization),
                  progress=not no_progress, log=lambda line: typer.echo(line, err=True))
    elapsed = time.perf_counter() - t0
    res = _rl_write(arms, run, out, flat=flat, head={"model": model, "device": device, "elapsed_s": round(elapsed, 1)})
    if as_json:
        from rlparity.cli.common import echo_json

        echo_json(res)
        return
    _rl_print(res, out, elapsed)


def _rl_check(run: RLRunSettings, profile: Optional[list[str]], out: Path) -> None:
    """``rlparity experiment rl``'s refusals (``run``: the :class:`~rlparity.experiments.rl.RLRunSettings`
    the command builds), before a model is built or ``--out`` is made."""
    from rlparity.experiments.rl import OLD_POLICIES, RLRunSettings, rl_profile

    if run.lr <= 0:
        raise BadInput(f"--lr {run.lr}: the learning rate must be positive, e.g. --lr 1e-3")
    output_folder(out, "rl.zarr")
    bad = [o for o in run.old_policy or [] if o not in OLD_POLICIES]
    if bad:
        raise BadInput(f"--old-policy: unknown {bad}; choose from {', '.join(OLD_POLICIES)}")
    for name in profile or []:
        rl_profile(name)
    if run.fault is not None or run.fault_from_step is not None:
        try:
            RLRunSettings(steps=run.steps, fault=run.fault, fault_from_step=run.fault_from_step).resolved()
        except ValueError as err:
            raise BadInput(f"--fault / --fault-from-step: {err}") from None
        raw = [n for n in profile or _R.profiles if rl_profile(n).logprobs_mode != "processed_logprobs"]
        if raw:
            raise BadInput(f"--fault {run.fault}: {', '.join(raw)} does not report processed logprobs; give "
                           "--profile pipelinerl-parity (or another processed-logprobs profile)")


def _rl_write(arms: dict, run: RLRunSettings, out: Path, *, flat: bool, head: dict) -> dict:
    """rl.json (first, then again with the findings), rl.zarr (and its tar parts; only those with
    ``flat``) and rl_curves.csv in ``out``; the result (``head``: model, device, elapsed_s)."""
    import shutil

    from rlparity.config.provenance import write_json
    from rlparity.experiments.rl import diagnose_first_steps, pack, summarize
    from rlparity.metrics import rl as mrl
    from rlparity.trace import save

    res = summarize(arms, findings=False)
    res.update({**head,
                "sizes": {"steps": run.steps, "n_prompts": run.n_prompts, "n_samples": run.n_samples,
                          "max_tokens": run.max_tokens, "lr": run.lr, "loss": run.loss,
                          "old_policy": run.old_policy or list(_R.old_policy), "dtype": run.dtype,
                          "async_rollouts": run.async_rollouts, "fault": run.fault,
                          "fault_from_step": run.fault_from_step},
                "engine_effective": {name: effective_settings(arms[k])
                                     for k, (name, step) in mrl.run_steps(arms).items() if step == 0},
                "store": "rl.zarr"})
    write_json(out / "rl.json", res)  # first: the numbers survive a store that cannot be written
    store = save(arms, out / "rl.zarr")
    res["archive"] = [p.name for p in pack(store, out)]
    res["unpack"] = f"cat {res['archive'][0].split('.part')[0]}* | tar xz  # gives rl.zarr"
    if flat:
        shutil.rmtree(store)
        res["store"] = "rl.zarr (packed: see archive and unpack)"
    try:
        report = diagnose_first_steps(arms)
        res.update({"findings": report.to_dict()["findings"], "verdict": report.verdict})
    except Exception as err:  # noqa: BLE001 - the curves and the store are written; say why the findings are not
        res["findings_error"] = f"{type(err).__name__}: {err}"
    write_json(out / "rl.json", res)
    mrl.rl_curves(arms).to_dataframe().to_csv(out / "rl_curves.csv")
    return res


def _rl_print(res: dict, out: Path, elapsed: float) -> None:
    """Each run against the reference run, then what was written where."""
    for prof, c in res["contrast"].items():
        typer.echo(f"{prof}: mean ratio at step 0 {c['mean_ratio_step0']:.4f}, max |mean ratio - 1| "
                   f"{c['max_abs_mean_ratio_minus_1']:.4f}, clamp indicator {c['clamp_indicator_mean']:.4f} "
                   f"({c['clamp_indicator_vs_reference']:.3g}x the reference), reward {c['reward_mean']:.3f} "
                   f"(first to last {c['reward_first_to_last']:+.3f}, gap {c['reward_gap_mean']:+.3f})")
    typer.echo(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} in {out} ({elapsed:.0f} s of runs)")
    typer.echo(f"curves: rlparity.metrics.rl.rl_curves(rlparity.trace.open_arms({str(out / 'rl.zarr')!r}))")


__all__ = ["rl_cmd"]
