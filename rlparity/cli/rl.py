"""The online RL run: ``rl-run``."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from rlparity.cli.common import echo_json, model_path, output_store, sampling_settings
from rlparity.cli.contract import BadInput, engine_logs, option_defaults

_D = option_defaults()
_R = _D.rl


class Loss(str, Enum):
    gspo = "gspo"
    ppo = "ppo"
    grpo = "grpo"


class OldPolicy(str, Enum):
    pi_old = "pi_old"
    mu = "mu"


def rl_run_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="zarr store for every step's trace (arms <profile>@step_NNN)"),
    model: str = typer.Option("tiny", help="'tiny' (built-in) or a local checkpoint: the initial weights"),
    profile: Optional[list[str]] = typer.Option(None, help="engine profile (repeat); default: "
                                                           + ", ".join(_R.profiles)),
    steps: int = typer.Option(_R.steps, min=1, help="optimizer steps per profile"),
    loss: Loss = typer.Option(Loss(_R.loss), help="the objective of every step"),
    old_policy: Optional[list[OldPolicy]] = typer.Option(
        None, help="the loss's ratio denominator, one run each (repeat): pi_old recomputed by the trainer, or the "
                   "engine's mu (PipelineRL); default: " + " and ".join(_R.old_policy)),
    n_prompts: int = typer.Option(_R.n_prompts, min=1, help="prompts per step"),
    n_samples: int = typer.Option(_R.n_samples, min=2, help="samples per prompt (the advantage's group)"),
    max_tokens: int = typer.Option(_R.max_tokens, min=1),
    lr: float = typer.Option(_R.lr, min=0.0, help="AdamW learning rate"),
    temperature: float = _D.temperature,
    top_k: int = _D.top_k,
    seed: int = _D.seed,
    async_rollouts: bool = typer.Option(False, help="generate step k+1's rollouts while step k trains (lag 1)"),
    device: str = typer.Option("cpu", help="the trainer's device (cuda on a GPU host)"),
    curves: Optional[Path] = typer.Option(None, help="also write the curves and the contrast as JSON here"),
    as_json: bool = typer.Option(False, "--json", help="print the curves and the contrast as strict JSON"),
):
    """Online RL on the built-in arithmetic task, one real AsyncLLM per engine profile: sample, rescore
    pi_old with the trainer, one optimizer step, push the weights into the running engine (pause /
    update / resume). One run per profile and ratio denominator (pi_old recomputed, or the engine's
    mu as PipelineRL uses it), each from the same initial weights and seeds; a progress bar per run
    ticks once per step. Prints, per run, the backend ratio pi_old/mu, PipelineRL's clamp indicator
    and the reward against the first profile's run of the same ratio denominator.
    """
    engine_logs()
    from rlparity.config.provenance import write_json
    from rlparity.experiments.rl import rl_run, summarize
    from rlparity.trace import save

    if lr <= 0:
        raise BadInput(f"--lr {lr}: the learning rate must be positive, e.g. --lr 1e-3")
    output_store(out)
    sampling = sampling_settings(temperature=temperature, top_k=top_k, seed=seed)
    olds = [o.value for o in old_policy] if old_policy else None
    arms = rl_run(model_path(model), profile or None, steps, loss=loss.value, old_policy=olds,
                  n_prompts=n_prompts, n_samples=n_samples, max_tokens=max_tokens, lr=lr, seed=seed,
                  sampling=sampling, async_rollouts=async_rollouts, device=device, progress=True,
                  log=lambda line: typer.echo(line, err=True))
    store = save(arms, out)
    res = summarize(arms)
    res["store"] = str(store)
    if curves is not None:
        write_json(curves, res)
    if as_json:
        echo_json(res)
        return
    typer.echo(f"{len(arms)} steps written to {store}; each run against the reference profile's run of the same "
               "ratio denominator:")
    for prof, c in res["contrast"].items():
        typer.echo(f"  {prof}: mean pi_old/mu at step 0 {c['mean_ratio_step0']:.4f} (max |ratio - 1| "
                   f"{c['max_abs_mean_ratio_minus_1']:.4f}); clamp indicator {c['clamp_indicator_mean']:.3f} "
                   f"({c['clamp_indicator_vs_reference']:.3g}x); reward {c['reward_mean']:.3f} "
                   f"(first to last {c['reward_first_to_last']:+.3f}, gap {c['reward_gap_mean']:+.3f})")
    typer.echo(f"curves: rlparity.metrics.rl.rl_curves(rlparity.trace.open_arms({str(store)!r}))")
