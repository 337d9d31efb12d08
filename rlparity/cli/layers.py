"""``rlparity layers`` (where the engine's per-layer states part from the trainer's: ``run`` the
scenarios on real engines, ``show`` a store's profiles) and ``rlparity verify-weights`` (the weights
a running engine holds against the trainer's, tensor by tensor)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlparity.cli.common import check_model, comma_list, command_group, device_option, echo_json
from rlparity.cli.contract import EXIT_FAIL, EXIT_OK, BadInput, engine_logs


def profile_rows(arms) -> list[dict]:
    """Per arm with a layer profile: what it is compared with, where it starts to diverge, and why."""
    from rlparity.diagnose.layers import divergence_start

    rows = []
    for name, ds in arms.items():
        f = divergence_start(ds.assign_attrs(arm=name))
        if f is None:
            continue
        e = f.evidence
        rows.append({"arm": name, "comparison": e.get("comparison"), "finding": f.name,
                     "site": e.get("site", "-"),
                     "relative_error": e.get("relative_error", e.get("max_relative_error", float("nan"))),
                     "ratio_to_floor": e.get("ratio_to_floor", e.get("max_ratio_to_floor", float("nan"))),
                     "cause": f.cause or "", "summary": f.summary})
    return rows


def _show_rows(rows: list[dict], as_json: bool) -> None:
    if as_json:
        echo_json(rows)
        return
    typer.echo(f"{'arm':<36} {'starts at':<16} {'rel. error':>10} {'x floor':>9}  cause")
    for r in rows:
        site = {"divergence_starts_at": r["site"], "layers_not_judged": "(not judged)"}.get(r["finding"],
                                                                                          "(within floor)")
        ratio = r["ratio_to_floor"]
        typer.echo(f"{r['arm']:<36} {site:<16} {r['relative_error']:>10.3g} "
                   f"{(f'{ratio:.3g}' if ratio == ratio else '-'):>9}  {r['cause']}")


def run_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="zarr store to write (one arm per scenario)"),
    model: Optional[str] = typer.Option(None, help="local checkpoint directory (version 0); default: --size",
                                        callback=check_model),
    size: str = typer.Option("tiny", help="built-in model when --model is not given"),
    scenarios: Optional[str] = typer.Option(None, help="comma list of scenarios (default: all this platform runs): "
                                                "clean, partial_weight_sync, stale_prefix_cache, "
                                                "trainer_bf16_head, rollout_bf16_head, batch_variant_attention"),
    device: str = device_option(),
    n_prompts: int = typer.Option(4, min=1, help="probe sequences"),
    max_tokens: int = typer.Option(16, min=1),
    as_json: bool = typer.Option(False, "--json", help="print the profiles as strict JSON"),
):
    """Run the scenarios that must be located (a partial weight sync, a bf16 head on either side, a
    stale prefix cache, another attention backend) on real engines with the layer hooks on, save the
    scored arms with their profiles, and print where each one starts to diverge."""
    engine_logs()
    import xarray as xr

    from rlparity.cli.common import model_path, output_store
    from rlparity.config.provenance import jsonable
    from rlparity.experiments.layers import SCENARIOS, LayerSettings, run_layers
    from rlparity.trace import save

    chosen = comma_list(scenarios, "--scenarios", list(SCENARIOS))
    output_store(out)
    if model is not None and not Path(model).is_dir():
        raise BadInput(f"--model {model}: no such checkpoint directory (the scenarios write new versions beside it)")
    path = model or model_path(size)
    arms, record = run_layers(path, chosen, LayerSettings(n_prompts=n_prompts, max_tokens=max_tokens, device=device),
                              log=lambda m: typer.echo(m, err=True))
    tree = xr.DataTree.from_dict({a: ds for a, ds in arms.items()})
    tree.attrs["layers_run"] = jsonable(record)
    save(tree, out)
    _show_rows(profile_rows(arms), as_json)
    for name, why in record["not_run"].items():
        typer.echo(f"not run: {name}: {why}", err=True)
    typer.echo(f"wrote {out}", err=True)
    raise typer.Exit(EXIT_OK)


def show_cmd(
    store: Path = typer.Argument(..., help="a store whose arms carry layer profiles (rlparity layers run)"),
    arm: Optional[list[str]] = typer.Option(None, "--arm", help="only these arms (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print the profiles as strict JSON"),
):
    """Where each arm's states first leave their floor (exit 1 if any arm's do)."""
    from rlparity.cli.common import select_arms
    from rlparity.trace import open_arms

    if not store.exists():
        raise BadInput(f"{store}: no such store")
    arms = select_arms(open_arms(store), arm, store)
    rows = profile_rows(arms)
    if not rows:
        raise BadInput(f"{store} holds no layer profile (no arm has layer_diff_rms): run `rlparity layers run` first")
    _show_rows(rows, as_json)
    if any(r["finding"] == "divergence_starts_at" for r in rows):
        raise typer.Exit(EXIT_FAIL)
    empty = [r["arm"] for r in rows if r["finding"] == "layers_not_judged"]
    if empty:  # no verdict on nothing: not a pass
        raise BadInput(f"{store}: the layer profile of arm(s) {empty} holds nothing to judge (no sequence, or no finite "
                       "difference at any site): record it again with `rlparity layers run`")
    raise typer.Exit(EXIT_OK)


def verify_weights_cmd(
    model: str = typer.Argument(..., help="the checkpoint the engine starts from (path, hub id, or tiny/small)",
                                callback=check_model),
    update: Optional[Path] = typer.Option(None, help="a checkpoint (directory or .safetensors) to load into the "
                                              "running engine first, as an RL weight update does"),
    trainer: Optional[Path] = typer.Option(None, help="the trainer's weights (checkpoint directory or .safetensors); "
                                               "default: --update, else the model"),
    engine: Optional[str] = typer.Option(None, help="engine settings as JSON"),
    profile: Optional[str] = typer.Option(None, help="engine profile (name or YAML)"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as strict JSON"),
):
    """Read the weights the engine holds in its workers (fused qkv/gate_up split back into checkpoint
    names) and compare every tensor with the trainer's (checksums of bf16-rounded values). Exit 1
    naming each tensor and layer that differs."""
    from rlparity.capture.checkpoints import checkpoint_names
    from rlparity.cli.common import engine_settings, model_path
    from rlparity.trace.weights import layers_of, tensors_not_equal

    settings = engine_settings(engine, profile)
    given = {}
    for name, p in (("--update", update), ("--trainer", trainer)):
        if p is not None:
            try:
                given[name] = checkpoint_names(p)
            except (OSError, ValueError) as err:
                raise BadInput(f"{name} {p}: {err}") from None
    path = model_path(model)
    theirs = str(trainer or update or path)
    if not Path(theirs).exists():  # neither --trainer nor --update: the model is the trainer's weights
        raise BadInput(f"{model}: no local checkpoint of that name (the trainer's weights default to the model's "
                       "files): pass a checkpoint directory, a built-in model, or --trainer PATH")
    if given and Path(path).exists():
        try:
            own = set(checkpoint_names(path))
        except (OSError, ValueError) as err:
            raise BadInput(f"{model}: {err}") from None
        for name, names in given.items():
            if not own & set(names):
                raise BadInput(f"{name} {trainer if name == '--trainer' else update}: none of its {len(names)} "
                               f"tensor names ({names[0]}, ...) is one of {model}'s ({sorted(own)[0]}, ...): pass "
                               "the weights of this model")
    engine_logs()
    from rlparity.capture import Engine
    from rlparity.experiments.layers import verify_weights

    with Engine(path, settings) as eng:
        eng.start()
        if update is not None:
            eng.update_weights(str(update), 1, clear_cache=True)
        res = verify_weights(eng, theirs)
    cmp = res["compare"]
    bad = tensors_not_equal(cmp)
    if as_json:
        echo_json({"equal": res["equal"], "differ": cmp["differ"], "missing_in_engine": cmp["missing_in_engine"],
                   "not_finite": cmp.get("not_finite", []),
                   "only_in_engine": cmp["only_in_engine"], "layers": layers_of(bad), "n_compared": cmp["n_compared"],
                   "engine_seconds": res["engine_seconds"], "startup_s": eng.startup_s})
    elif res["equal"]:
        typer.echo(f"ok: the engine's weights equal the trainer's ({cmp['n_compared']} tensors compared; read in the "
                   f"workers in {res['engine_seconds']:.3g} s)")
    else:
        typer.echo(f"weights differ: {len(bad)} tensor(s) of the trainer's weights are not what the engine holds "
                   f"(layers {layers_of(bad) or 'none'}; {cmp['n_compared']} compared)")
        for n in bad:
            layer = layers_of([n])
            why = ("missing in the engine" if n in cmp["missing_in_engine"] else "NaN or infinite values (not comparable)"
                   if n in cmp.get("not_finite", ()) else "values differ")
            typer.echo(f"  {n}" + (f" (layer {layer[0]})" if layer else "") + f": {why}")
        typer.echo(f"fix: {res['finding'].fix}")
    raise typer.Exit(EXIT_OK if res["equal"] else EXIT_FAIL)


def build_app() -> typer.Typer:
    """The ``rlparity layers`` sub-app with its commands."""
    return command_group("Per-layer divergence: the first layer and module where the engine's hidden states "
                         "leave their floor against the trainer's (or another arm's engine).",
                         {"run": run_cmd, "show": show_cmd})


__all__ = ["build_app", "profile_rows"]
