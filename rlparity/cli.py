"""The ``rlparity`` command line (typer). Each area registers its own commands."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Capture vLLM rollouts, rescore them with the trainer, and diagnose parity.")


@app.command("make-model")
def make_model_cmd(
    size: str = typer.Option("tiny", help="built-in size: tiny (CPU/CI) or small (GPU)"),
    out: Optional[Path] = typer.Option(None, help="where to save (default: the rlparity cache)"),
    seed: int = 0,
    vocab_pad_to: Optional[int] = typer.Option(None, help="pad the vocabulary to this size"),
    device: str = "cpu",
    force: bool = False,
):
    """Build, briefly train and save a small Llama model; print its path."""
    from rlparity.models import make_model

    typer.echo(make_model(size, out, seed=seed, vocab_pad_to=vocab_pad_to, device=device, force=force))


@app.command("capture")
def capture_cmd(
    model: str = typer.Argument(..., help="local path or hub id"),
    out: Path = typer.Option(..., "--out", "-o", help="zarr store to write"),
    prompts: Optional[Path] = typer.Option(None, help="text file, one prompt per line, or JSONL with 'prompt'/'prompt_token_ids'"),
    num_prompts: int = typer.Option(32, help="built-in arithmetic prompts when --prompts is not given"),
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_tokens: int = 32,
    n: int = 1,
    seed: int = 0,
    engine: Optional[str] = typer.Option(None, help="engine settings as JSON, e.g. '{\"logprobs_mode\": \"processed_logprobs\"}'"),
    profile: Optional[str] = typer.Option(None, help="named or YAML engine profile"),
    arm: str = typer.Option("default", help="arm name inside the store"),
    score: bool = typer.Option(True, help="also rescore with the trainer (transformers)"),
    trainer_dtype: str = "float32",
    trainer_head_dtype: str = "float32",
):
    """Sample prompts with real vLLM, rescore with the trainer, add the arm to a zarr store."""
    from rlparity.capture import Engine, EngineSettings, SamplingSettings
    from rlparity.trace import add_arm

    settings = _engine_settings(engine, profile)
    sampling = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p,
                                max_tokens=max_tokens, n=n, seed=seed)
    items = _read_prompts(prompts, num_prompts, seed)
    with Engine(model, settings) as eng:
        trace = eng.capture(items, sampling, arm=arm)
    add_arm(trace, out, arm)  # keep the rollout even if rescoring fails
    if score:
        from rlparity.score import score as _score

        trace = _score(trace, model, dtype=trainer_dtype, head_dtype=trainer_head_dtype)
        add_arm(trace, out, arm)
    typer.echo(f"wrote arm {arm!r} ({trace.sizes['sequence']} sequences) to {out}")


@app.command("score")
def score_cmd(
    trace: Path,
    model: Optional[str] = typer.Option(None, help="trainer model (default: the trace's model)"),
    dtype: str = "float32",
    head_dtype: str = "float32",
    device: str = "cpu",
    arm: Optional[list[str]] = typer.Option(None, help="arms to rescore (default: all)"),
):
    """Rescore the arms of a store with transformers, in place (atomically)."""
    from rlparity.score import Scorer
    from rlparity.trace import open_arms, save

    arms = open_arms(trace)
    scorers: dict[str, Scorer] = {}
    for name, ds in arms.items():
        if arm and name not in arm:
            continue
        m = model or ds.attrs["model"]
        if m not in scorers:
            scorers[m] = Scorer(m, dtype=dtype, head_dtype=head_dtype, device=device)
        arms[name] = scorers[m].score(ds)
    save(arms, trace)
    typer.echo(f"rescored {len(scorers) and len(arm or arms)} arm(s) in {trace}")


@app.command("summary")
def summary_cmd(
    trace: Path,
    trainer: str = typer.Option("processed", help="trainer side: processed or raw"),
    arm: Optional[str] = None,
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of text"),
):
    """Print the parity summary (per-token log-ratio stats, mean ratio, probability-0 tokens)."""
    from rlparity.metrics import format_summary, summary
    from rlparity.trace import open_arms

    arms = open_arms(trace)
    out = {}
    for name, ds in arms.items():
        if arm and name != arm:
            continue
        s = summary(ds, trainer=trainer)  # type: ignore[arg-type]
        if as_json:
            out[name] = {k: s[k].item() for k in s.data_vars if s[k].ndim == 0}
        else:
            typer.echo(format_summary(s))
    if as_json:
        typer.echo(json.dumps(out, indent=2))


@app.command("run")
def run_cmd(
    out: Path = typer.Option(Path("runs/quickstart.zarr"), "--out", "-o"),
    size: str = "tiny",
    num_prompts: int = 32,
    max_tokens: int = 32,
    temperature: float = 0.7,
    top_k: int = 20,
):
    """The main job: build the small model, capture raw and processed logprobs with real vLLM,
    rescore with the trainer (fp32 head on both sides), print the parity summary, write the trace."""
    from rlparity.capture import Engine, EngineSettings, SamplingSettings
    from rlparity.metrics import format_summary, summary
    from rlparity.models import make_model, make_prompts
    from rlparity.score import Scorer
    from rlparity.trace import add_arm

    model = make_model(size)
    prompts = make_prompts(num_prompts)
    sampling = SamplingSettings(temperature=temperature, top_k=top_k, max_tokens=max_tokens)
    scorer = Scorer(model, dtype="float32", head_dtype="float32")
    for mode in ("processed_logprobs", "raw_logprobs"):
        with Engine(model, EngineSettings(logprobs_mode=mode, head_dtype="float32")) as eng:
            trace = eng.capture(prompts, sampling, arm=mode)
        trace = scorer.score(trace)
        add_arm(trace, out, mode)
        typer.echo(format_summary(summary(trace)))
    typer.echo(f"trace written to {out} (arms: processed_logprobs, raw_logprobs)")


def _engine_settings(engine_json: str | None, profile: str | None):
    from rlparity.capture import EngineSettings

    base: dict = {}
    if profile:
        mod = importlib.import_module("rlparity.capture.profiles")
        base = mod.load_profile(profile).model_dump()
    if engine_json:
        try:
            base.update(json.loads(engine_json))
        except json.JSONDecodeError as err:
            raise typer.BadParameter(f"--engine is not JSON: {err}") from err
    return EngineSettings(**base)


def _read_prompts(path: Path | None, num: int, seed: int):
    from rlparity.models import make_prompts

    if path is None:
        return make_prompts(num, seed=seed)
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return [line for line in text.splitlines() if line.strip()]


# Commands contributed by other areas: a module that exists must define register(app).
_PLUGINS = ["rlparity.diagnose.cli", "rlparity.capture.cli", "rlparity.check"]
for _name in _PLUGINS:
    try:
        _mod = importlib.import_module(_name)
    except ModuleNotFoundError as _err:
        if _err.name != _name:
            raise
        continue
    _mod.register(app)


if __name__ == "__main__":  # pragma: no cover
    app()
