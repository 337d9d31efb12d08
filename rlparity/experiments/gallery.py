"""The gallery: every diagnosis of the method captured on one device, written as compact stores.

``rlparity gallery --device cuda --out DIR`` runs,
on the ``small`` built-in model with a bf16 body:

* ``semantic``: ``raw_logprobs`` and ``processed_logprobs`` x LM head bf16 / fp32, each at several
  temperatures (per request, one engine per setting), rescored by a bf16-body trainer with an fp32
  head (the parity setup);
* ``head``: the LM-head matrix (rollout head x trainer head) at temperature 0.7, from the same
  processed engines;
* ``fresh``: a second capture on other prompts and seeds (not shipped: its verdicts check that the
  shipped examples are not a lucky draw);
* ``ablation``: the inference-path ablation from ``pipelinerl-parity`` with batch composition.

Every engine captures all the requests it serves before the next starts (engines are the cost).
Each store is compacted (:func:`rlparity.datasets.compact`) and stamped with provenance; a
``gallery.json`` holds every verdict and number. CPU runs work too (``--device cpu --size tiny``).
"""

from __future__ import annotations

import datetime as dt
import os
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.config.defaults import default_sampling
from rlparity.config.provenance import library_versions, write_json
from rlparity.config.settings import EngineSettings, with_overrides

PARTS = ("semantic", "head", "fresh", "ablation")
TEMPERATURES = (0.5, 0.7, 1.0, 1.3)
HEADS = ("bfloat16", "float32")


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    import platform

    return f"CPU ({platform.machine()})"


def provenance(device: str, model: str, command: str, description: str) -> dict[str, Any]:
    """The ``example`` root attrs of a gallery store.

    Parameters
    ----------
    device : str
        The device the gallery ran on (``cuda`` or ``cpu``).
    model : str
        The built-in model's size name.
    command : str
        The command line that reproduces the store.
    description : str
        What the store holds.

    Returns
    -------
    dict
        ``description``, ``device``, ``device_name`` (the GPU's name, or ``CPU (<machine>)``),
        the vLLM, torch and transformers versions, today's ``date``, ``model`` and ``command``.
    """
    v = library_versions()
    return {"description": description, "device": device, "device_name": _device_name(device),
            "vllm": v.get("vllm"), "torch": v.get("torch"), "transformers": v.get("transformers"),
            "date": dt.date.today().isoformat(), "model": model, "command": command}


def _save(arms: dict[str, xr.Dataset], path: Path, attrs: dict[str, Any], *, float_dtype: str | None) -> Path:
    from rlparity.datasets import save_example

    return save_example(arms, path, attrs, float_dtype=float_dtype)


def _verdicts(arms: dict[str, xr.Dataset]) -> dict[str, Any]:
    """Per arm: the semantic verdict and its evidence, the check's result, probability-0 tokens by cause."""
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.check import check
    from rlparity.metrics import summary, zero_prob_tokens

    report = diagnose(arms)
    gate = check(arms)
    out: dict[str, Any] = {}
    for arm, ds in arms.items():
        sem = [f for f in report if f.arm == arm and f.layer.value == "semantic"]
        main = sem[0] if sem else None
        s = summary(ds)
        noise = main.evidence.get("noise_floor_rms") if main else None
        causes = zero_prob_tokens(ds, noise_rms=noise)["cause"].values.tolist() if "trainer_processed_logprob" in ds \
            else []
        out[arm] = {
            "semantic": main.name if main else None, "semantic_severity": main.severity.value if main else None,
            "alpha_processed": main.evidence.get("alpha_processed") if main else None,
            "noise_floor_rms": noise,
            "rms_d_vs_processed": main.evidence.get("rms_d_vs_trainer_processed") if main else None,
            "rms_d_vs_raw": main.evidence.get("rms_d_vs_trainer_raw") if main else None,
            "mean_ratio": float(s["mean_ratio"]), "mean_abs_d": float(s["abs_log_ratio_mean"]),
            "n_tokens": int(s["n_tokens"]),
            "zero_prob": {c: causes.count(c) for c in ("boundary", "outside", "unclassified")},
            "problems": sorted({f"{f.layer.value}/{f.name}:{f.severity.value}" for f in report.problems()
                                if f.arm == arm}),
            "check_passed": all(c.passed for c in gate.checks if c.arm == arm),
            "check_failed": [c.name for c in gate.checks if c.arm == arm and not c.passed],
        }
    return out


def _capture_all(model: str, device: str, size_prompts: dict[str, Any], scorers: dict[str, Any],
                 engine_base: EngineSettings, progress: bool) -> dict[str, dict[str, xr.Dataset]]:
    """One engine per (logprobs mode, rollout head); each serves every request that needs it."""
    from rlparity.capture.pool import shared_pool
    from rlparity.experiments.semantic import sweep_sampling
    from rlparity.metrics.head_precision import arm_name
    from rlparity.trace import with_factors

    p = size_prompts
    sem_index, sem_sampling = sweep_sampling(len(p["semantic"]), p["temperatures"], top_k=20,
                                             max_tokens=p["max_tokens"], seed=0)
    sem_requests = [p["semantic"][i] for i in sem_index]
    head_sampling = default_sampling(max_tokens=p["max_tokens"], seed=0)
    fresh_sampling = default_sampling(max_tokens=p["max_tokens"], seed=1000)
    stores: dict[str, dict[str, xr.Dataset]] = {"semantic": {}, "head": {}, "fresh": {}}
    pool = shared_pool()
    for head in HEADS:
        for mode in ("raw_logprobs", "processed_logprobs"):
            settings = engine_base.replace(logprobs_mode=mode, head_dtype=head)
            eng = pool.get(model, settings)
            tag = f"{mode.split('_')[0]}-head_{'fp32' if head == 'float32' else 'bf16'}"
            if "semantic" in p["parts"]:
                tr = eng.capture(sem_requests, sem_sampling, arm=tag, progress=progress)
                stores["semantic"][tag] = scorers["float32"].score(tr)
            if "fresh" in p["parts"] and head == "float32" and not p.get("fresh_model"):  # other prompts and seeds
                tr = eng.capture(p["fresh"], fresh_sampling, arm=f"fresh-{tag}", progress=progress)
                stores["fresh"][f"fresh-{tag}"] = scorers["float32"].score(tr)
            if mode == "processed_logprobs" and "head" in p["parts"]:
                tr = eng.capture(p["head"], head_sampling, arm=f"rollout-{head}", progress=progress)
                for th, sc in scorers.items():
                    scored = sc.score(tr)
                    name = arm_name(head, th)
                    with_factors(scored, rollout_head=head, trainer_head=th)
                    scored.attrs.update(arm=name, head_experiment={"rollout_head": head, "trainer_head": th,
                                                                   "body_dtype": engine_base.dtype, "device": device})
                    stores["head"][name] = scored
    if "fresh" in p["parts"] and p.get("fresh_model"):  # another model too: 2 more engines
        from rlparity.score import Scorer

        fresh_scorer = Scorer(p["fresh_model"], dtype="bfloat16", head_dtype="float32", device=device, progress=False)
        for mode in ("raw_logprobs", "processed_logprobs"):
            eng = pool.get(p["fresh_model"], engine_base.replace(logprobs_mode=mode, head_dtype="float32"))
            tag = f"fresh-{mode.split('_')[0]}-head_fp32"
            tr = eng.capture(p["fresh"], fresh_sampling, arm=tag, progress=progress)
            stores["fresh"][tag] = fresh_scorer.score(tr)
    pool.close()
    return stores


@dataclass(frozen=True)
class GallerySettings:
    """What :func:`gallery` captures: on ``device`` with the built-in model ``size``, ``n_prompts``
    prompts (``n_head_prompts`` for the LM-head matrix) of ``max_tokens`` at ``temperatures``,
    the ``parts`` of :data:`PARTS`; the ablation on ``ablation_prompts`` shared-prefix prompts over
    ``ablation_knobs`` (default: every default knob); ``gpu_memory_utilization`` of each engine on
    a GPU; stores named ``<name_prefix>-<part>.zarr`` (default ``h200`` on CUDA, else ``cpu``);
    ``fresh_size``: the fresh capture on another built-in model (e.g. ``small-bf16``: a different
    checkpoint, not only other prompts)."""

    device: str = "cuda"
    size: str = "small"
    n_prompts: int = 128
    n_head_prompts: int = 256
    max_tokens: int = 32
    temperatures: Sequence[float] = TEMPERATURES
    parts: Sequence[str] = PARTS
    ablation_prompts: int = 8
    ablation_knobs: Sequence[str] | None = None
    gpu_memory_utilization: float | None = 0.3
    name_prefix: str | None = None
    fresh_size: str | None = None


def _check(s: GallerySettings) -> None:
    """Refuse settings the gallery cannot run, before a model is built or an engine starts."""
    from rlparity.config.settings import device_name
    from rlparity.experiments.ablation import KNOBS

    device_name(s.device)
    unknown = sorted(set(s.parts) - set(PARTS))
    if unknown or not s.parts:
        raise ValueError(f"unknown gallery part(s) {unknown or list(s.parts)}; choose from {', '.join(PARTS)}")
    knobs = sorted(set(s.ablation_knobs or ()) - set(KNOBS))
    if knobs:
        raise ValueError(f"unknown ablation knob(s) {knobs}; choose from {', '.join(KNOBS)}")
    small = {k: getattr(s, k) for k in ("n_prompts", "n_head_prompts", "max_tokens", "ablation_prompts")
             if getattr(s, k) < 1}
    if small:
        raise ValueError(f"gallery sizes must be at least 1: {small}")


def gallery(out_dir: str | os.PathLike, settings: GallerySettings | None = None, *, progress: bool = False,
            **overrides: Any) -> dict[str, Any]:
    r"""Run the gallery and write its stores and ``gallery.json`` into ``out_dir``.

    Writes ``<prefix>-<part>.zarr`` stores (compacted, with provenance) and ``gallery.json``.
    Keeps going after a failed part (its traceback lands in the results).

    Parameters
    ----------
    out_dir : str or os.PathLike
        Where the stores and ``gallery.json`` go (created if missing).
    settings : GallerySettings, optional
        Sizes, device and parts; ``None`` means ``GallerySettings()`` (a CUDA run of the
        ``small`` model).
    progress : bool, default False
        Show progress bars.
    \*\*overrides
        Fields of :class:`GallerySettings`, replacing those of ``settings``.

    Returns
    -------
    dict
        The results: device, size, parts, versions, model, per part the verdicts per arm and the
        store's path, the head table's RMS values, the ablation table, ``seconds``, and
        ``error_capture`` / ``error_ablation`` tracebacks of failed parts.

    Raises
    ------
    ValueError
        If a setting is out of range (a part or knob unknown, a count below 1, a device rlparity does
        not run on): checked before any model is built.
    TypeError
        If an override is not a field of :class:`GallerySettings`.
    """
    s = with_overrides(settings or GallerySettings(), overrides, "gallery")
    from rlparity.models import make_model, make_prompts
    from rlparity.score import Scorer

    _check(s)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = s.name_prefix or ("h200" if s.device.startswith("cuda") else "cpu")
    t0 = time.time()
    results: dict[str, Any] = {"device": s.device, "size": s.size, "parts": list(s.parts), "versions": library_versions()}
    model = str(make_model(s.size, device=s.device, progress=progress))
    results["model"] = model
    command = (f"rlparity gallery --device {s.device} --size {s.size} --n-prompts {s.n_prompts} "
               f"--max-tokens {s.max_tokens}")
    gpu = s.device.startswith("cuda")
    float_dtype = "float32" if gpu else None
    engine_base = EngineSettings(dtype="bfloat16", gpu_memory_utilization=s.gpu_memory_utilization if gpu else None,
                                 generation_config="vllm", enable_prefix_caching=False)
    scorers = {h: Scorer(model, dtype="bfloat16", head_dtype=h, device=s.device, progress=False) for h in HEADS}
    prompts = {"semantic": make_prompts(s.n_prompts, seed=0), "head": make_prompts(s.n_head_prompts, seed=0),
               "fresh": make_prompts(s.n_prompts, seed=7), "temperatures": tuple(s.temperatures),
               "max_tokens": s.max_tokens, "parts": tuple(s.parts),
               "fresh_model": str(make_model(s.fresh_size, device=s.device, progress=progress))
               if s.fresh_size and s.fresh_size != s.size else None}
    try:
        if set(s.parts) & {"semantic", "head", "fresh"}:
            stores = _capture_all(model, s.device, prompts, scorers, engine_base, progress)
            descriptions = {
                "semantic": "raw vs processed logprobs x LM head bf16/fp32 at temperatures "
                            f"{', '.join(map(str, s.temperatures))} (top-k 20), trainer bf16 body + fp32 head",
                "head": "LM-head precision matrix: rollout head x trainer head (bf16 body, T=0.7, top-k 20)"}
            for part, arms in stores.items():
                if not arms:
                    continue
                results[part] = _verdicts(arms)
                if part in descriptions:
                    path = _save(arms, out / f"{prefix}-{part}.zarr",
                                 provenance(s.device, s.size, command, descriptions[part]), float_dtype=float_dtype)
                    results[f"{part}_store"] = str(path)
            if "head" in stores and stores["head"]:
                from rlparity.metrics.head_precision import head_table, matched_advantage

                table = head_table(stores["head"])
                results["head_table_rms"] = {str(table["arm"].values[i, j]): float(table["abs_log_ratio_rms"].values[i, j])
                                             for i in range(table.sizes["rollout_head"])
                                             for j in range(table.sizes["trainer_head"])}
                results["head_matched_advantage"] = matched_advantage(table)
    except Exception:  # keep what was measured, say what broke
        results["error_capture"] = traceback.format_exc()
    if "ablation" in s.parts:
        try:
            from rlparity.experiments.ablation import DEFAULT_KNOBS, BatchProbe, ablation, shared_prefix_prompts
            from rlparity.metrics.ablation import ablation_table
            from rlparity.metrics.summary import table_records

            engine = {"dtype": "bfloat16", **({"gpu_memory_utilization": s.gpu_memory_utilization} if gpu else {})}
            arms = ablation(model, shared_prefix_prompts(s.ablation_prompts),
                            default_sampling(max_tokens=16, seed=0), knobs=list(s.ablation_knobs or DEFAULT_KNOBS),
                            engine=engine, scorer=scorers["float32"], batch=BatchProbe(max_tokens=16))
            from rlparity.capture.pool import shared_pool

            shared_pool().close()
            results["ablation_table"] = table_records(ablation_table(arms))
            path = _save(arms, out / f"{prefix}-ablation.zarr",
                         provenance(s.device, s.size, command, "inference-path ablation from pipelinerl-parity (bf16 "
                                    "body), one knob at a time, with batch composition"), float_dtype=float_dtype)
            results["ablation_store"] = str(path)
        except Exception:
            results["error_ablation"] = traceback.format_exc()
    results["seconds"] = round(time.time() - t0, 1)
    write_json(out / "gallery.json", results)
    return results


__all__ = ["HEADS", "PARTS", "TEMPERATURES", "gallery", "provenance"]
