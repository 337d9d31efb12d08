"""Commands that make and read traces: ``make-model``, ``capture``, ``score``, ``summary``, ``run``."""

from __future__ import annotations


from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from rlparity.cli.common import (
    TrainerSide,
    block_progress,
    check_model,
    dask_progress,
    device_option,
    echo_json,
    engine_settings,
    output_store,
    read_prompts,
    sampling_settings,
    select_arms,
)
from rlparity.cli.contract import engine_logs, option_defaults
from rlparity.metrics.dashboard.traces import DASHBOARDS

_D = option_defaults()
Dashboard = Enum("Dashboard", {n.replace("-", "_"): n for n in DASHBOARDS}, type=str)


def make_model_cmd(
    size: str = typer.Option("tiny", help="built-in size: tiny (CPU/CI) or small (GPU)"),
    out: Optional[Path] = typer.Option(None, help="where to save (default: the rlparity cache)"),
    seed: int = 0,
    vocab_pad_to: Optional[int] = typer.Option(None, min=1, help="pad the vocabulary to this size"),
    device: str = device_option(help="the device it trains on"),
    force: bool = False,
):
    """Build, briefly train and save a small Llama model; print its path."""
    from rlparity.cli.contract import BadInput
    from rlparity.models import SIZES, make_model

    if size not in SIZES:
        raise BadInput(f"--size {size!r}: choose a built-in size: {', '.join(SIZES)}")
    if out is not None and out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: a file; give a folder for the model")

    typer.echo(make_model(size, out, seed=seed, vocab_pad_to=vocab_pad_to, device=device, force=force))


def capture_cmd(
    model: str = typer.Argument(..., help="local path or hub id ('tiny' = the built-in model)", callback=check_model),
    out: Path = typer.Option(..., "--out", "-o", help="zarr store to write"),
    prompts: Optional[Path] = typer.Option(None, help="text file, one prompt per line, or JSONL with "
                                                      "'prompt'/'prompt_token_ids'/'messages'"),
    num_prompts: int = typer.Option(32, help="built-in arithmetic prompts when --prompts is not given"),
    temperature: float = _D.temperature,
    top_k: int = _D.top_k,
    top_p: float = _D.top_p,
    max_tokens: int = typer.Option(32, min=1),
    n: int = typer.Option(1, min=1),
    seed: int = _D.seed,
    engine: Optional[str] = typer.Option(None, help="engine settings as JSON, e.g. '{\"logprobs_mode\": "
                                                    "\"processed_logprobs\"}'"),
    profile: Optional[str] = typer.Option(None, help="named or YAML engine profile"),
    arm: str = typer.Option("default", help="arm name inside the store"),
    score: bool = typer.Option(True, help="also rescore with the trainer (transformers)"),
    trainer_dtype: str = "float32",
    trainer_head_dtype: str = "float32",
    trainer: Optional[str] = typer.Option(None, help="how the trainer computes, as JSON (TrainerSettings), e.g. "
                                                     "'{\"routing_replay\": \"also\"}' for a MoE capture with "
                                                     "--engine '{\"capture_routing\": true}'"),
):
    """Sample prompts with real vLLM, rescore with the trainer, add the arm to a zarr store."""
    engine_logs()
    from rlparity.capture import Engine
    from rlparity.cli.common import model_path, trainer_settings
    from rlparity.trace import add_arm

    output_store(out)
    settings = engine_settings(engine, profile)
    how = trainer_settings(trainer)
    sampling = sampling_settings(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens, n=n,
                                 seed=seed)
    items = read_prompts(prompts, num_prompts, seed)
    model = model_path(model)
    with Engine(model, settings) as eng:
        trace = eng.capture(items, sampling, arm=arm)
    add_arm(trace, out, arm)  # keep the rollout even if rescoring fails
    if score:
        from rlparity.score import score as _score

        trace = _score(trace, model, dtype=trainer_dtype, head_dtype=trainer_head_dtype, settings=how)
        add_arm(trace, out, arm)
    typer.echo(f"wrote arm {arm!r} ({trace.sizes['sequence']} sequences) to {out}")


def score_cmd(
    trace: Path = typer.Argument(..., help="zarr store written by rlparity"),
    model: Optional[str] = typer.Option(None, help="trainer model (default: each arm's own model)",
                                        callback=check_model),
    dtype: str = "float32",
    head_dtype: str = "float32",
    device: str = device_option(),
    arm: Optional[list[str]] = typer.Option(None, help="arms to rescore (default: all)"),
    trainer: Optional[str] = typer.Option(None, help="how the trainer computes, as JSON (TrainerSettings), e.g. "
                                                     "'{\"routing_replay\": \"also\", \"router_dtype\": "
                                                     "\"float32\"}' (routing replay needs routed_experts)"),
    nproc: int = typer.Option(1, min=1, help="processes (torchrun; one GPU each with --device cuda, gloo on the "
                                             "CPU): each scores a share of the micro-batches, the result equals one "
                                             "process's"),
):
    """Rescore the arms of a store with transformers, in place (atomically). A mixture-of-experts
    model's routers are recorded too (top-k and margins, beside the engine's routes)."""
    from rlparity.cli.common import trainer_settings
    from rlparity.score import Scorer
    from rlparity.trace import arm_record, open_arms, save

    how = trainer_settings(trainer)
    if nproc > 1:
        import subprocess
        import sys

        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m",
               "rlparity.score.distributed", str(trace), "--dtype", dtype, "--head-dtype", head_dtype,
               "--device", device]
        cmd += (["--model", model] if model else []) + [x for a in (arm or []) for x in ("--arm", a)]
        cmd += ["--trainer", how.model_dump_json()] if trainer else []
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            raise RuntimeError(f"the distributed rescoring failed (torchrun exit {rc}); its output is above")
        return
    arms = open_arms(trace)
    chosen = select_arms(arms, arm, trace)
    scorers: dict[str, Scorer] = {}
    for name, ds in chosen.items():
        m = model or arm_record(ds).model
        if not m:
            raise ValueError(f"arm {name!r} names no model: pass --model PATH_OR_HUB_ID")
        if m not in scorers:
            scorers[m] = Scorer(m, dtype=dtype, head_dtype=head_dtype, device=device, settings=how)
        arms[name] = scorers[m].score(ds)
    save(arms, trace)
    typer.echo(f"rescored {len(chosen)} arm(s) in {trace}: {', '.join(chosen)}")


def summary_cmd(
    trace: Path = typer.Argument(..., help="zarr store written by rlparity"),
    trainer: TrainerSide = typer.Option(TrainerSide(_D.trainer), help="trainer reading: processed or raw"),
    arm: Optional[list[str]] = typer.Option(None, help="only these arms (default: all)"),
    names: Optional[Dashboard] = typer.Option(None, help="the same numbers under a peer's dashboard names "
                                                         "(verl rollout_corr/*, PipelineRL, prime-rl, slime, TRL, "
                                                         "NeMo-RL), to put beside yours"),
    as_json: bool = typer.Option(False, "--json", help="print strict JSON instead of text"),
    chunks: Optional[int] = typer.Option(None, min=1, help="read the store lazily, this many sequences at a "
                                                          "time (traces larger than memory; needs dask)"),
):
    """Print the parity summary (per-token log-ratio stats, mean ratio, probability-0 tokens), or
    with --names the peers' dashboard metrics (same formulas as theirs). With --chunks the store
    is read block by block (memory: a few blocks) and only the scalars are printed; with --names
    too, the peer's formulas stream over the chunks (dask, one pass)."""
    from rlparity.metrics import as_dashboard, format_summary, scalars, summary
    from rlparity.trace import open_arms

    arms = select_arms(open_arms(trace, chunks=chunks), arm, trace)
    if chunks is not None and names is None:
        bar = block_progress()
        if as_json:
            echo_json({name: scalars(summary(ds, trainer.value, progress=bar)) for name, ds in arms.items()})
        else:
            for ds in arms.values():
                typer.echo(format_summary(ds, trainer.value))
        return
    if names is not None:
        with dask_progress(chunks is not None):
            dash = {name: as_dashboard(ds, names.value, trainer=trainer.value) for name, ds in arms.items()}
        if as_json:
            echo_json({name: {"metrics": dict(d), **d.info} for name, d in dash.items()})
            return
        for name, d in dash.items():
            typer.echo(f"{names.value} dashboard  arm={name}  pair={d.info.get('pair')}  "
                       f"direction={d.info.get('direction')}")
            for k, v in d.items():
                typer.echo(f"  {k:<48} {v:>14.6g}")
        return
    from rlparity.metrics.routing import format_routing, has_routes, routing_record

    if as_json:
        echo_json({name: {**scalars(summary(ds, trainer.value)),
                          **({"routing": routing_record(ds, trainer.value)} if has_routes(ds) else {})}
                   for name, ds in arms.items()})
        return
    for ds in arms.values():
        typer.echo(format_summary(ds, trainer.value))
        if has_routes(ds):
            typer.echo(format_routing(ds, trainer.value))


def run_cmd(
    out: Path = typer.Option(Path("runs/quickstart.zarr"), "--out", "-o"),
    size: str = "tiny",
    num_prompts: int = typer.Option(32, min=1),
    max_tokens: int = typer.Option(32, min=1),
    temperature: float = _D.temperature,
    top_k: int = _D.top_k,
    overwrite: bool = typer.Option(True, help="replace the arms of an existing quick-start store"),
):
    """The main job: build the small model, capture raw and processed logprobs with real vLLM,
    rescore with the trainer (fp32 head on both sides), print the parity summary and one verdict
    per arm with its fix, write the trace."""
    log = engine_logs()
    from rlparity.capture import Engine, EngineSettings
    from rlparity.diagnose import diagnose
    from rlparity.metrics import format_summary_table
    from rlparity.models import make_model, make_prompts
    from rlparity.score import Scorer
    from rlparity.trace import add_arm

    output_store(out)
    sampling = sampling_settings(temperature=temperature, top_k=top_k, max_tokens=max_tokens)
    model = make_model(size)
    prompts = make_prompts(num_prompts)
    typer.echo(f"rlparity run: {size} model, {num_prompts} prompts x {max_tokens} tokens, temperature "
               f"{temperature}, top-k {top_k}; rollout and trainer LM head in float32")
    scorer = Scorer(model, dtype="float32", head_dtype="float32")
    arms = {}
    for mode in ("processed_logprobs", "raw_logprobs"):
        typer.echo(f"capturing with vLLM, logprobs_mode={mode} ...")
        with Engine(model, EngineSettings(logprobs_mode=mode, head_dtype="float32")) as eng:
            trace = eng.capture(prompts, sampling, arm=mode)
        arms[mode] = scorer.score(trace)
        add_arm(arms[mode], out, mode)
    typer.echo("")
    typer.echo("parity summary (backend pair: d = log pi_old - log mu, nats)")
    typer.echo(format_summary_table(arms))
    report = diagnose(arms)
    typer.echo("")
    typer.echo("verdicts (rlparity diagnose for the evidence):")
    for line in report.summary_lines():
        typer.echo(f"  {line}")
    typer.echo("")
    typer.echo(f"wrote {out} (arms: {', '.join(arms)})" + (f"; vLLM's log: {log}" if log else ""))
    typer.echo(f"next: rlparity diagnose {out}   |   rlparity check {out}")
