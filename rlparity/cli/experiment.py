"""``rlparity experiment NAME --out DIR``: run one of the project's experiments on real engines and
write its folder (the store, a JSON of the numbers; ``--example NAME``: a compact example store
with its provenance, what rlparity ships as example data). One command per experiment module of
:mod:`rlparity.experiments`: ``ablation``, ``faults``, ``floors``, ``inflight``, ``moe``,
``objective``, ``rl`` (in :mod:`rlparity.cli.experiment_rl`). On a GPU host
(one call, e.g. with ``RLPARITY_ENGINE_LOCK=off``): ``--device cuda --dtype bfloat16``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from rlparity.cli.common import (
    check_model,
    comma_list,
    command_group,
    device_option,
    effective_settings,
    engine_overrides,
    gpu_memory_option,
    output_folder,
    output_store,
    positive_ints,
    size_option,
)
from rlparity.cli.contract import BadInput, engine_logs, invocation_command, option_defaults
from rlparity.cli.experiment_rl import rl_cmd

_D = option_defaults()
_R = _D.rl
_GPU_MEMORY = gpu_memory_option()
_SIZE = size_option()
_DEVICE = device_option()


def _built_model(size: str, device: str) -> str:
    """The built-in model ``size`` (trained on ``device`` when it is not the CPU), as a path."""
    from rlparity.models import make_model

    return str(make_model(size, progress=False, **({"device": device} if device != "cpu" else {})))


def faults_cmd(
    out: Path = typer.Option(..., "--out", help="folder for the store and faults.json"),
    model: Optional[str] = typer.Option(None, help="local checkpoint (version 0); default: the built-in --size",
                                        callback=check_model),
    size: str = _SIZE,
    device: str = _DEVICE,
    dtype: Optional[str] = typer.Option(None, help="body dtype on both sides (default: the checkpoint's)"),
    arms: Optional[str] = typer.Option(None, help="'single', 'pairs' or a comma list of arms like "
                                                  "raw_logprobs+stale_prefix_cache"),
    n_prompts: int = typer.Option(4, min=1),
    max_tokens: int = typer.Option(16, min=1),
    sigma: float = 0.05,
    inflight_tokens: Optional[int] = typer.Option(None, help="max_tokens of the requests in flight across the "
                                                             "update (default: --max-tokens; a GPU needs more, "
                                                             "e.g. 128)"),
    update_after: float = typer.Option(1 / 3, help="share of the in-flight tokens before the update"),
    gpu_memory_utilization: Optional[float] = _GPU_MEMORY,
    example: Optional[str] = typer.Option(None, help="save a compact example store DIR/NAME.zarr with provenance"),
    seed: int = typer.Option(0, help="seeds the prompts, the requests and the version-1 perturbation (another seed: "
                                     "a matrix held out from one scored before)"),
):
    """The fault matrix on a built-in model (or --model): DIR/faults.zarr (every arm; with --example
    NAME a compact example store DIR/NAME.zarr), DIR/faults.json (the scores, every arm's headline);
    prints the scores."""
    engine_logs()
    from rlparity.config.provenance import write_json
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.scoring import ARM_RESULT_COLUMNS, format_scores, score_matrix
    from rlparity.experiments.faults.matrix import MATRIX_DESCRIPTION, MatrixSettings, run_matrix
    from rlparity.experiments.faults.recipes import parse_arms
    from rlparity.experiments.gallery import provenance
    from rlparity.metrics import table_records
    from rlparity.trace import save

    chosen = parse_arms(arms, platform="cuda" if device.startswith("cuda") else "cpu")
    output_folder(out, f"{example or 'faults'}.zarr")
    out.mkdir(parents=True, exist_ok=True)
    model = model or _built_model(size, device)
    settings = MatrixSettings(n_prompts=n_prompts, max_tokens=max_tokens, sigma=sigma, device=device, dtype=dtype,
                              engine=engine_overrides(gpu_memory_utilization), inflight_tokens=inflight_tokens,
                              update_after=update_after, seed=seed)
    t0 = time.perf_counter()
    traces = run_matrix(model, chosen, settings, workdir=out / "checkpoints")
    elapsed = time.perf_counter() - t0
    report = diagnose(traces)
    scores = score_matrix(traces, report)
    write_json(out / "faults.json", {
        "summary": scores.attrs, "elapsed_s": round(elapsed, 1), "settings": settings.model_dump(), "model": model,
        "per_cause": table_records(scores[["n_present", "recall", "false_alarms", "n_headline"]], "cause"),
        "per_arm": table_records(scores[list(ARM_RESULT_COLUMNS)], "arm"),
        "headlines": report.summary_lines(), "attribution": report.attribution})
    if example:
        from rlparity.datasets import save_example

        prov = provenance(device, Path(model).name, invocation_command(), f"the fault matrix: {MATRIX_DESCRIPTION}")
        store = save_example(traces, out / f"{example}.zarr", prov)
    else:
        store = save(traces, out / "faults.zarr")
    typer.echo(format_scores(scores))
    typer.echo(f"wrote {store} and {out / 'faults.json'} in {elapsed:.0f} s")


def floors_cmd(
    out: Path = typer.Option(..., "--out", help="folder for the store and floors.json"),
    model: Optional[str] = typer.Option(None, help="local checkpoint; default: --shape, else the built-in --size",
                                        callback=check_model),
    size: str = typer.Option("tiny", help="built-in trained model (tiny, tiny-bf16, small)"),
    shape: Optional[str] = typer.Option(None, help="a random model of a real shape built on the device (1.5b, 7b)"),
    device: str = _DEVICE,
    dtype: str = typer.Option("float32", help="body dtype on both sides"),
    n_prompts: int = typer.Option(64, min=1),
    max_tokens: int = typer.Option(64, min=1),
    shapes: Optional[str] = typer.Option(None, help="comma list of trainer shapes (default: all of SHAPES)"),
    gpu_memory_utilization: Optional[float] = _GPU_MEMORY,
    example: Optional[str] = typer.Option(None, help="save a compact example store DIR/NAME.zarr"),
):
    """The floor run: one rollout rescored under every trainer shape, the engine's batch spread;
    DIR/floors.json (the table, the findings) and the store (--example NAME: a compact example
    store)."""
    engine_logs()
    from rlparity.config.provenance import write_json
    from rlparity.config.profiles import reference_engine
    from rlparity.config.settings import SamplingSettings
    from rlparity.diagnose import diagnose
    from rlparity.experiments.floors import REFERENCE, SHAPES, floor_run
    from rlparity.experiments.gallery import provenance
    from rlparity.metrics import table_records
    from rlparity.metrics.floors import floor_table, trainer_floor
    from rlparity.models import make_model, make_prompts, make_shape_model
    from rlparity.trace import save

    picked = comma_list(shapes, "--shapes", list(SHAPES))
    output_folder(out, f"{example or 'floors'}.zarr")
    out.mkdir(parents=True, exist_ok=True)
    dev = {"device": device} if device != "cpu" else {}
    if not model:
        model = str(make_shape_model(shape, dtype=dtype, **dev)) if shape else str(make_model(size, progress=False,
                                                                                             **dev))
    chosen = {k: SHAPES[k] for k in picked} if picked else SHAPES
    if REFERENCE not in chosen:
        chosen = {REFERENCE: SHAPES[REFERENCE], **chosen}
    engine = reference_engine(dtype=dtype, enable_prefix_caching=False, **engine_overrides(gpu_memory_utilization))
    t0 = time.perf_counter()
    arms = floor_run(model, make_prompts(n_prompts), SamplingSettings(temperature=0.7, top_k=20, max_tokens=max_tokens,
                     seed=0), shapes=chosen, engine=engine, dtype=dtype, device=device)
    table = floor_table(arms, REFERENCE)
    invariant = None
    if {"batch_invariant", "batch_invariant_shuffled"} <= set(arms):
        f = trainer_floor(arms["batch_invariant"], arms["batch_invariant_shuffled"])
        invariant = {k: float(f[k]) for k in f.data_vars}
    report = diagnose(arms, title="floors")
    label = shape or Path(model).name
    write_json(out / "floors.json", {"model": label, "device": device, "dtype": dtype,
                                     "table": table_records(table), "engine_floor": table.attrs.get("engine_floor"),
                                     "batch_invariant_mode_floor": invariant,
                                     "shapes": table.attrs["shapes"], "headlines": report.summary_lines(),
                                     "findings": [f.to_dict() for f in report if f.name.endswith("batch_invariant")],
                                     "elapsed_s": round(time.perf_counter() - t0, 1)})
    if example:
        from rlparity.datasets import save_example

        store = save_example(arms, out / f"{example}.zarr", provenance(device, label, invocation_command(), "floors: "
                             "one rollout rescored under the trainer shapes real trainers use, with the engine's "
                             "batch spread"))
    else:
        store = save(arms, out / "floors.zarr")
    typer.echo(str(table[["floor_mean_abs", "floor_max_abs", "share_of_gap", "relative_throughput"]]
                   .to_dataframe().round(6)))
    typer.echo(f"backend gap (mean |d|, {REFERENCE}): {float(table['gap_mean_abs_d']):.4g}; engine batch spread: "
               f"{(table.attrs.get('engine_floor') or {}).get('batch_shape')}")
    typer.echo(f"wrote {store} and {out / 'floors.json'}")


def inflight_cmd(
    out: Path = typer.Option(..., "--out", help="folder for inflight.zarr and inflight.json"),
    model: Optional[str] = typer.Option(None, help="local checkpoint (version 0); default: the built-in model",
                                        callback=check_model),
    size: str = _SIZE,
    new_weights: Optional[str] = typer.Option(None, help="checkpoint of version 1 (default: a perturbation)",
                                              callback=check_model),
    sigma: float = typer.Option(0.05, help="relative noise of the default perturbation"),
    device: str = _DEVICE,
    dtype: str = typer.Option("float32", help="body dtype on both sides"),
    n_prompts: int = typer.Option(8, min=1),
    max_tokens: int = typer.Option(48, min=1),
    gpu_memory_utilization: Optional[float] = _GPU_MEMORY,
    ci: bool = typer.Option(False, "--ci", help="small sizes (4 prompts, 32 tokens)"),
):
    """The in-flight weight-update matrix (pause mode x cache clearing x prefix caching):
    DIR/inflight.zarr (every arm) and DIR/inflight.json (tables, ratios, findings)."""
    engine_logs()
    from rlparity.config.provenance import write_json
    from rlparity.experiments.inflight import inflight_matrix, summarize
    from rlparity.models import make_model
    from rlparity.trace import arm_record, save

    output_folder(out, "inflight.zarr")
    out.mkdir(parents=True, exist_ok=True)
    model = model or str(make_model(size, progress=False))
    n, mt = (4, 32) if ci else (n_prompts, max_tokens)
    t0 = time.perf_counter()
    arms = inflight_matrix(model, new_weights=new_weights, sigma=sigma, n_prompts=n, max_tokens=mt, dtype=dtype,
                           device=device, engine=engine_overrides(gpu_memory_utilization), checkpoint_dir=out / "v1")
    elapsed = time.perf_counter() - t0
    res = summarize(arms)
    first = next(iter(arms.values()))
    res.update({"model": model, "device": device, "dtype": dtype, "sizes": {"n_prompts": n, "max_tokens": mt},
                "elapsed_s": round(elapsed, 1), "store": str(out / "inflight.zarr"),
                "engine_effective": effective_settings(first),
                "weight_loading": {k: arm_record(first).inflight["update"].get(k)
                                   for k in ("boundary_source", "stream_behind", "pause_kwargs", "load_method")}})
    write_json(out / "inflight.json", res)  # first: the numbers survive a store that cannot be written
    store = save(arms, out / "inflight.zarr")
    for arm, r in res["reset_ratios"].items():
        typer.echo(f"{arm}: mean |d| after the update {r['kept']:.3g} nats vs {r['reset']:.3g} with the cache reset "
                   f"({r['ratio']:.3g}x)")
    typer.echo(f"stale arms flagged: {res['flagged_stale_arms']}")
    for m, v in res["lag_by_mode"].items():
        typer.echo(f"lag {m}: mean {v['lag_mean']:.3f}, off-policy share {v['offpolicy_share']:.2f}, "
                   f"pause {v['pause_s']:.2f} s, aborted tokens {v['aborted_tokens']:.0f}")
    typer.echo(f"wrote {store} and {out / 'inflight.json'} in {elapsed:.0f} s")


def moe_cmd(
    out: Path = typer.Option(..., "--out", help="the zarr store to write (one arm per setting)"),
    size: str = typer.Option("tiny-moe", help="built-in MoE model (or --model PATH)"),
    model: Optional[str] = typer.Option(None, callback=check_model),
    dense: str = typer.Option("tiny", help="built-in dense model for the comparison ('' = none)"),
    dtype: str = "float32",
    device: str = device_option(),
    n_prompts: int = typer.Option(16, min=1),
    max_tokens: int = typer.Option(24, min=1),
):
    """The mixture-of-experts experiment on the built-in models: the store saved, the routing
    numbers and the diagnosis printed."""
    engine_logs()
    import json

    from rlparity.capture.pool import shared_pool
    from rlparity.diagnose import diagnose
    from rlparity.experiments.moe import MoESettings, moe_run
    from rlparity.metrics.routing import has_routes, routing_record
    from rlparity.models import make_model
    from rlparity.trace import save

    output_store(out)
    model = model or str(make_model(size, progress=False, device=device))
    dense_model = str(make_model(dense, progress=False, device=device)) if dense else None
    try:
        arms = moe_run(model, dense_model, MoESettings(n_prompts=n_prompts, max_tokens=max_tokens, dtype=dtype,
                                                       device=device))
    finally:
        shared_pool().close()
    save(arms, out)
    typer.echo(json.dumps({k: routing_record(v) for k, v in arms.items() if has_routes(v)}, indent=1))
    typer.echo(str(diagnose(arms)))


def objective_cmd(
    out: Path = typer.Option(..., "--out", help="folder for the store and objective.json"),
    model: Optional[str] = typer.Option(None, help="local checkpoint; default: the built-in --size",
                                        callback=check_model),
    size: str = _SIZE,
    device: str = _DEVICE,
    dtype: str = typer.Option("float32", help="body dtype on both sides"),
    n_prompts: int = typer.Option(16, min=1),
    n_samples: int = typer.Option(4, min=1),
    max_tokens: int = typer.Option(24, min=1),
    lr: float = 3e-5,
    cap: Optional[float] = typer.Option(None, help="the TIS cap C (default: the quantile that truncates "
                                                   "--truncate-share of the tokens)"),
    truncate_share: float = 0.1,
    gpu_memory_utilization: Optional[float] = _GPU_MEMORY,
    example: Optional[str] = typer.Option(None, help="save a compact example store DIR/NAME.zarr"),
):
    """Chapter 5's experiment: parity and raw captures of the same samples, one optimizer step
    (pi_theta), and a correction (token TIS + a geometric sequence mask) applied to the raw trace
    against the parity update: DIR/objective.json (the demonstration's numbers, the objective tables,
    verl's dashboard) and the store (--example NAME: a compact example store with the numbers in
    its attrs)."""
    engine_logs()
    from rlparity.config.provenance import write_json
    from rlparity.experiments.gallery import provenance
    from pydantic import ValidationError

    from rlparity.cli.common import validation_message
    from rlparity.experiments.objective import ObjectiveSettings, run_objective
    from rlparity.metrics import table_records
    from rlparity.trace import save

    try:
        settings = ObjectiveSettings(n_prompts=n_prompts, n_samples=n_samples, max_tokens=max_tokens, lr=lr, cap=cap,
                                     truncate_share=truncate_share, device=device, dtype=dtype,
                                     engine=engine_overrides(gpu_memory_utilization))
    except ValidationError as err:
        raise BadInput(validation_message(err)) from None
    output_folder(out, f"{example or 'objective'}.zarr")
    out.mkdir(parents=True, exist_ok=True)
    model = model or _built_model(size, device)
    t0 = time.perf_counter()
    res = run_objective(model, settings)
    elapsed = time.perf_counter() - t0
    numbers = {"demo": res["demo"], "cap": res["cap"], "same_samples": res["same_samples"], "train_step": res["step"],
               "objective_summary": {k: table_records(t) for k, t in res["tables"].items()},
               "dashboards": res["dashboards"], "settings": res["settings"], "elapsed_s": round(elapsed, 1),
               "model": model}
    write_json(out / "objective.json", numbers)
    if example:
        from rlparity.config.provenance import jsonable
        from rlparity.datasets import save_example

        prov = provenance(device, Path(model).name, invocation_command(), "the objective layer: parity and raw "
                          "captures of the same samples, one optimizer step (pi_theta), and token TIS + a sequence "
                          "mask applied to the raw trace against the parity update")
        store = save_example(res["arms"], out / f"{example}.zarr", prov, objective=jsonable(numbers))
    else:
        store = save(res["arms"], out / "objective.zarr")
    d = res["demo"]
    typer.echo(f"raw mean ratio {d['before']['mean_ratio']:.4f} -> {d['after']['mean_ratio']:.4f} after TIS at "
               f"C={res['cap']:.3g} ({d['truncated_fraction']:.1%} of tokens truncated) and the mask "
               f"({d['masked_fraction']['tokens']:.1%} masked); verl health rules pass: "
               f"{d['corrected_health']['looks_healthy']}; gradient cosine with the parity update: corrected "
               f"{d['cosine_raw_corrected_vs_parity']:.3f}, uncorrected {d['cosine_raw_uncorrected_vs_parity']:.3f} "
               f"(mu as the denominator: {d['cosine_raw_vs_parity_mu_denominator']:.3f})")
    typer.echo(f"wrote {store} and {out / 'objective.json'} in {elapsed:.0f} s")


def ablation_cmd(
    out: Path = typer.Option(..., "--out", help="folder for the store and ablation.json"),
    model: Optional[str] = typer.Option(None, help="local checkpoint; default: the built-in --size",
                                        callback=check_model),
    size: str = _SIZE,
    device: str = _DEVICE,
    dtype: str = typer.Option("float32", help="body dtype pinned on both sides"),
    reference: str = typer.Option(_D.profile, help="the reference profile every knob is changed from (name or YAML)"),
    knobs: Optional[str] = typer.Option(None, help="comma list of knobs (default: every built-in knob)"),
    n_prompts: int = typer.Option(8, min=1),
    max_tokens: int = typer.Option(16, min=1),
    temperature: float = typer.Option(_D.temperature, help="sampling temperature"),
    top_k: int = typer.Option(_D.top_k, help="sampling top-k (0 = off)"),
    batch_sizes: str = typer.Option("1,2,4,8", help="batch sizes of the batch-composition test"),
    budget_s: Optional[float] = typer.Option(None, help="start no knob's engine after this many seconds (the rest "
                                                        "stay as rows saying so)"),
    gpu_memory_utilization: Optional[float] = _GPU_MEMORY,
    example: Optional[str] = typer.Option(None, help="save a compact example store DIR/NAME.zarr"),
):
    """One-knob-at-a-time inference-path ablation from a reference profile (default
    pipelinerl-parity), same prompts and seeds, with the batch-composition test: DIR/ablation.json
    (the table, what moved, the batch table, the findings) and the store (--example NAME: a
    compact example store with provenance)."""
    engine_logs()
    from rlparity.capture import SamplingSettings
    from rlparity.capture.pool import shared_pool
    from rlparity.config.provenance import write_json
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.path import moved_settings
    from rlparity.experiments import ablation as abl
    from rlparity.experiments.gallery import provenance
    from rlparity.metrics import ablation as mab
    from rlparity.metrics import table_records
    from rlparity.score import Scorer
    from rlparity.trace import save

    chosen = comma_list(knobs, "--knobs", list(abl.KNOBS)) or list(abl.DEFAULT_KNOBS)
    sizes = positive_ints(batch_sizes, "--batch-sizes")
    output_folder(out, f"{example or 'ablation'}.zarr")
    out.mkdir(parents=True, exist_ok=True)
    model = model or _built_model(size, device)
    prompts = abl.shared_prefix_prompts(n_prompts)
    sampling = SamplingSettings(temperature=temperature, top_k=top_k, max_tokens=max_tokens, seed=0)
    scorer = Scorer(model, dtype=dtype, head_dtype="float32", device=device, progress=False)
    t0 = time.perf_counter()
    try:
        arms = abl.ablation(model, prompts, sampling, reference=reference, knobs=chosen,
                            engine={"dtype": dtype, **engine_overrides(gpu_memory_utilization)}, scorer=scorer,
                            batch=abl.BatchProbe(sizes=sizes, max_tokens=max_tokens), budget_s=budget_s)
    finally:
        shared_pool().close()
    elapsed = time.perf_counter() - t0
    table, batch = mab.ablation_table(arms), mab.batch_table(arms)
    report = diagnose(arms, title="Inference-path ablation")
    numbers = {"settings": table_records(table), "moved": moved_settings(table), "batch": table_records(batch),
               "findings": report.to_dict()["findings"], "knobs": chosen, "elapsed_s": round(elapsed, 1),
               "sizes": {"n_prompts": n_prompts, "max_tokens": max_tokens, "batch_sizes": sizes}, "model": model,
               "dtype": dtype}
    write_json(out / "ablation.json", numbers)
    if example:
        from rlparity.datasets import save_example

        prov = provenance(device, Path(model).name, invocation_command(), "the inference-path ablation: from "
                          "pipelinerl-parity, one engine setting changed at a time on the same prompts and seeds, "
                          "each arm rescored by the same trainer, with the batch-composition test per engine")
        store = save_example(arms, out / f"{example}.zarr", prov)
    else:
        store = save(arms, out / "ablation.zarr")
    typer.echo(table.drop_vars("reason").to_dataframe().to_string())
    for s, what in numbers["moved"].items():
        typer.echo(f"{s}: {', '.join(what) if what else 'nothing (bitwise equal to the reference)'}")
    typer.echo(f"wrote {store} and {out / 'ablation.json'} in {elapsed:.0f} s")


def build_app() -> typer.Typer:
    """The ``rlparity experiment`` sub-app with its commands."""
    return command_group("Run one of the project's experiments on real engines into a folder (the store and a "
                         "JSON of its numbers; --example NAME: a compact example store with provenance).",
                         {"ablation": ablation_cmd, "faults": faults_cmd, "floors": floors_cmd,
                          "inflight": inflight_cmd, "moe": moe_cmd, "objective": objective_cmd, "rl": rl_cmd})


__all__ = ["build_app"]
