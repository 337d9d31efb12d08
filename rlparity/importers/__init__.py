"""Import the rollout logs other RL frameworks already write, as ordinary rlparity traces.

Formats (``rlparity.importers.formats()``):

* ``prime-rl``: trainer token exports, ``token_exports/step_N/rank_R.jsonl`` (both sides);
* ``nemo-rl``: ``train_data_step{N}.jsonl`` (both sides);
* ``slime``: ``--save-debug-rollout-data`` / ``--save-debug-train-data`` ``.pt`` files, read with
  ``torch.load(weights_only=True)`` only (rollout side; the train dump adds the trainer's);
* ``pipelinerl``: actor streams, ``streams/actor/0/0/0.jsonl`` (rollout side only);
* ``generic``: JSONL, Parquet or ``.npz`` for verl and custom loops (``GENERIC_FORMAT.md``).

Every importer ends in :func:`rlparity.trace.from_rollouts` (and
:func:`rlparity.trace.with_trainer` for the framework's own trainer logprobs), one arm per (run,
launch, split, step) of the dump, with those coordinates in ``attrs["import"]["coords"]`` (the arm
name is only a label: select with :func:`coordinates` / :func:`select`) and the provenance in
``attrs["import"]``. Tokens the framework's own masks leave out of RL (prime-rl ``rl_weights``,
NeMo-RL ``sample_loss_mask``, slime ``remove_sample``) are left out of the response and counted
per reason in ``attrs["import"]["excluded"]``. What a dump lacks is asked, never invented:
sampling parameters come from the dump, else the options, else the framework's documented
default, else they are stored as unknown (NaN temperature / top-p, top-k -1) and listed in
``attrs["sampling_unknown"]``; :func:`require_sampling` turns that into an error that names the
field and the option that supplies it.

All log-probabilities are in nats; the backend pair is (pi_old, mu) = (trainer, engine).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.importers.errors import ImportFormatError, PickleRefusedError
from rlparity.importers.reading import TrainerSpec
from rlparity.importers.sampling import (
    SAMPLING_FIELDS,
    MissingSamplingError,
    SamplingResolver,
    require_sampling,
    sampling_unknown,
)
from rlparity.importers.formats import FORMAT_MODULES, Format, get_format, stream_chunks
from rlparity.importers.store_writer import assemble, write_store
from rlparity.trace import arm_record

#: sequences per chunk: memory holds one chunk (plus one record) whatever the file size
DEFAULT_CHUNK_SIZE = 2048


def formats() -> dict[str, str]:
    """The importers, by format name.

    Returns
    -------
    dict of str to str
        ``{format name: what it reads}`` for every importer.
    """
    return {name: get_format(name).description for name in FORMAT_MODULES}


def _chunks(format: str, path, temperature, top_k, top_p, trainer_reading, chunk_size, progress):
    fmt: Format = get_format(format)
    sampling = SamplingResolver({"temperature": temperature, "top_k": top_k, "top_p": top_p},
                                dict(fmt.framework_sampling))
    builders: dict = {}
    chunks = stream_chunks(fmt, path, sampling=sampling, trainer_reading=trainer_reading, chunk_size=chunk_size,
                           progress=progress, builders=builders)
    return chunks, (lambda: {arm: b.final_attrs() for arm, b in builders.items()})


def read(format: str, path: str | os.PathLike, *, temperature: float | None = None, top_k: int | None = None,
         top_p: float | None = None, trainer_reading: str | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
         progress: bool = False) -> dict[str, xr.Dataset]:
    """Read a dump (a file or a folder of them) into ``{arm: trace}`` in memory.

    For files larger than memory use :func:`import_to_store`.

    Parameters
    ----------
    format : str
        One of :func:`formats` (``prime-rl``, ``nemo-rl``, ``slime``, ``pipelinerl``, ``generic``).
    path : str or os.PathLike
        A dump file or a folder of them.
    temperature : float, optional
        The run's sampling temperature when the dump does not record it (recorded as
        user-supplied; a value that contradicts the dump is an error). ``None``: from the dump,
        else the framework's documented default, else unknown.
    top_k : int, optional
        The run's top-k (0 = off), the same way.
    top_p : float, optional
        The run's top-p, the same way.
    trainer_reading : {"processed", "raw", "none"}, optional
        Overrides which schema variable the framework's own trainer logprobs go to; ``None``:
        decided per framework from its source, recorded in ``attrs["trainer"]``.
    chunk_size : int, default DEFAULT_CHUNK_SIZE
        Sequences read per chunk (2048).
    progress : bool, default False
        Show a progress bar.

    Returns
    -------
    dict of str to xarray.Dataset
        One trace per (run, launch, split, step) of the dump, coordinates and provenance in
        ``attrs["import"]``.

    Raises
    ------
    ImportFormatError
        If the dump is malformed (the message names the file and line).
    ValueError
        If the format is unknown, ``chunk_size`` is below 1, or a sampling option contradicts the dump.
    FileNotFoundError
        If ``path`` does not exist.
    """
    chunks, final = _chunks(format, path, temperature, top_k, top_p, trainer_reading, chunk_size, progress)
    return assemble(chunks, final)


@dataclass
class ImportResult:
    """What :func:`import_to_store` wrote: the store and, per arm, its coordinates, counts and trainer reading.

    ``str(result)`` is a short summary, one line per arm, with the warnings and the options that
    would record sampling parameters the dump lacks.

    Parameters
    ----------
    store : pathlib.Path
        The zarr store written.
    format : str
        The format's name.
    arms : dict of str to dict
        Per arm: ``coords``, ``sequences``, ``tokens``, ``excluded_tokens``, ``excluded`` (per
        reason), ``trainer_reading``, ``sampling_unknown``, ``fields_missing`` and ``warnings``.
    """

    store: Path
    format: str
    arms: dict[str, dict[str, Any]]

    def __str__(self) -> str:
        lines = [f"imported {self.format} -> {self.store}  ({len(self.arms)} arm{'s' if len(self.arms) != 1 else ''})"]
        for arm, a in self.arms.items():
            unknown = f"  unknown: {', '.join(a['sampling_unknown'])}" if a["sampling_unknown"] else ""
            coords = ", ".join(f"{k} {v}" for k, v in a["coords"].items() if v not in (None, "")
                               and not (k == "split" and v == "train"))
            excluded = f", {a['excluded_tokens']} excluded" if a["excluded_tokens"] else ""
            lines.append(f"  {arm} ({coords or 'one arm'}): {a['sequences']} sequences, {a['tokens']} tokens"
                         f"{excluded}, trainer: {a['trainer_reading']}{unknown}")
            lines += [f"    warning: {w}" for w in a.get("warnings", [])]
        flags = sorted({f for a in self.arms.values() for f in a["sampling_unknown"]}, key=SAMPLING_FIELDS.index)
        if flags:
            from rlparity.importers.sampling import OPTION_FLAG

            lines.append("  the dump does not record " + ", ".join(flags) + ": pass "
                         + " ".join(OPTION_FLAG[f] for f in flags) + " (the values your run used) to record them")
        return "\n".join(lines)


def _warnings(attrs: dict[str, Any]) -> list[str]:
    trainer = attrs.get("trainer") or {}
    out = []
    if trainer.get("copied_from_rollout_sequences"):
        out.append(f"{trainer['copied_from_rollout_sequences']} sequence(s) carry trainer logprobs identical to the "
                   "rollout's (a copy, e.g. verl's bypass mode): nothing to compare there")
    if trainer.get("not_renormalized_sequences"):
        out.append(f"{trainer['not_renormalized_sequences']} sequence(s) were sampled with a top-k/top-p cut the "
                   "framework's trainer does not apply: its logprobs there are not the sampler's distribution")
    for e in (attrs["import"].get("excluded") or {}).values():
        out.append(f"{e['tokens']} token(s) of {e['records']} sample(s) left out of the metrics: {e['reason']}")
    if not attrs["import"]["n_sequences"]:
        out.append("no sequence left: the arm is not in the store (every sample was excluded or had no sampled token)")
    return out


def coordinates(arms: Mapping[str, xr.Dataset]) -> xr.Dataset:
    """One row per imported arm: its coordinates and counts.

    Select arms by what they are, not by name: ``t = coordinates(arms); t.arm[t.step == 7]``.

    Parameters
    ----------
    arms : Mapping of str to xarray.Dataset
        Imported traces (their ``attrs["import"]``).

    Returns
    -------
    xarray.Dataset
        Dim ``arm``; variables ``run``, ``launch``, ``split``, ``step`` (-1 = none), ``kind``,
        ``sequences``, ``tokens`` and ``excluded_tokens``.
    """
    names = list(arms)
    imp = [arm_record(arms[a]).import_ or {} for a in names]
    coords = [i.get("coords") or {} for i in imp]

    def col(key: str, fill: Any) -> list:
        return [fill if c.get(key) is None else c[key] for c in coords]

    table = xr.Dataset(
        {"run": ("arm", np.array(col("run", ""), dtype=str)), "launch": ("arm", np.array(col("launch", ""), dtype=str)),
         "split": ("arm", np.array(col("split", ""), dtype=str)), "step": ("arm", np.array(col("step", -1), dtype=np.int64)),
         "kind": ("arm", np.array(col("kind", ""), dtype=str)),
         "sequences": ("arm", np.array([i.get("n_sequences", 0) for i in imp], dtype=np.int64)),
         "tokens": ("arm", np.array([i.get("n_tokens", 0) for i in imp], dtype=np.int64)),
         "excluded_tokens": ("arm", np.array([i.get("n_excluded_tokens", 0) for i in imp], dtype=np.int64))},
        coords={"arm": np.array(names, dtype=str)})
    table["step"].attrs["long_name"] = "step of the dump (-1 = the dump has none)"
    table["excluded_tokens"].attrs["long_name"] = "tokens the framework's masks left out of RL (not in the metrics)"
    return table


def select(arms: Mapping[str, xr.Dataset], **where: Any) -> dict[str, xr.Dataset]:
    r"""The arms whose coordinates equal the given values: ``select(arms, run="a", step=7)``.

    Parameters
    ----------
    arms : Mapping of str to xarray.Dataset
        Imported traces.
    \*\*where
        Values of ``run``, ``launch``, ``split``, ``step`` or ``kind`` to match.

    Returns
    -------
    dict of str to xarray.Dataset
        The matching arms, in their order.

    Raises
    ------
    ValueError
        If a keyword is not one of the coordinates.
    """
    unknown = sorted(set(where) - {"run", "launch", "split", "step", "kind"})
    if unknown:
        raise ValueError(f"unknown coordinate(s) {unknown}: select by run, launch, split, step or kind")
    out = {}
    for name, ds in arms.items():
        c = (arm_record(ds).import_ or {}).get("coords") or {}
        if all(c.get(k) == v for k, v in where.items()):
            out[name] = ds
    return out


def import_to_store(format: str, path: str | os.PathLike, out: str | os.PathLike, *,
                    temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                    trainer_reading: str | None = None, progress: bool = True, overwrite: bool = False,
                    chunk_size: int = DEFAULT_CHUNK_SIZE) -> ImportResult:
    """Import another framework's rollout dump into an rlparity zarr store.

    One arm per (run, launch, split, step) of the dump, with those coordinates and the provenance
    in each arm's attrs (several launches or runs under ``path`` give separate arms; two files that
    would make one arm and are not its shards are refused, naming both).

    Files are read in chunks of ``chunk_size`` sequences (a file larger than memory is fine). A
    malformed line stops the import with its file and line number; nothing half-written remains
    (``out`` is written beside and renamed into place).

    Most dumps do not record the sampling parameters: give the values your run used with
    ``temperature`` (``--temperature 0.7``), ``top_k`` (``--top-k 50``, 0 = off) and ``top_p``
    (``--top-p 0.95``); they are recorded as user-supplied. Without them the trace stores them
    as unknown and every check that needs them says so.

    By default the framework's own trainer logprobs go to ``trainer_processed_logprob`` when its
    trainer computes them at the sampling temperature (prime-rl, NeMo-RL, slime, verl), to both
    readings when the run sampled at temperature 1 without top-k/top-p. Dumps with the rollout side
    only (pipelinerl, slime rollout data) need ``rlparity score OUT --model MODEL`` next.

    Parameters
    ----------
    format : str
        One of prime-rl, nemo-rl, slime, pipelinerl, generic (``rlparity.importers.formats()``).
    path : str or os.PathLike
        A dump file or a folder of them (prime-rl: ``token_exports/``; nemo-rl: the log dir with
        ``train_data_step*.jsonl``; slime: ``.pt`` files; pipelinerl: the experiment or
        ``streams/``; generic: ``.jsonl``, ``.parquet`` or ``.npz`` files).
    out : str or os.PathLike
        The zarr store to write.
    temperature : float, optional
        The run's sampling temperature when the dump does not record it (recorded as
        user-supplied; a value that contradicts the dump is an error). ``None``: from the dump,
        else the framework's documented default, else unknown.
    top_k : int, optional
        The run's top-k (0 = off), the same way.
    top_p : float, optional
        The run's top-p, the same way.
    trainer_reading : {"processed", "raw", "none"}, optional
        Overrides which schema variable the framework's own trainer logprobs go to; ``None``:
        decided per framework from its source, recorded in ``attrs["trainer"]``.
    progress : bool, default True
        Show a progress bar.
    overwrite : bool, default False
        Replace an existing ``out``; without it an existing store is refused.
    chunk_size : int, default DEFAULT_CHUNK_SIZE
        Sequences read per chunk (2048): memory holds one chunk.

    Returns
    -------
    ImportResult
        The store and, per arm, its coordinates, counts, trainer reading and warnings.

    Raises
    ------
    ImportFormatError
        If the dump is malformed (the message names the file and line).
    ValueError
        If the format is unknown, ``chunk_size`` is below 1, a sampling option contradicts the dump, or
        no sample is left to write.
    FileNotFoundError
        If ``path`` does not exist.
    FileExistsError
        If ``out`` exists and ``overwrite`` is not set.
    """
    chunks, final = _chunks(format, path, temperature, top_k, top_p, trainer_reading, chunk_size, progress)
    store = write_store(chunks, out, final_attrs=final, overwrite=overwrite)
    attrs = final()
    arms = {arm: {"coords": dict(a["import"]["coords"]), "sequences": a["import"]["n_sequences"],
                  "tokens": a["import"]["n_tokens"], "excluded_tokens": a["import"]["n_excluded_tokens"],
                  "excluded": dict(a["import"]["excluded"]),
                  "trainer_reading": (a.get("trainer") or {}).get("reading", "none (rollout side only)"),
                  "sampling_unknown": list(a["sampling_unknown"]), "fields_missing": list(a["import"]["fields_missing"]),
                  "warnings": _warnings(a)}
            for arm, a in attrs.items()}
    return ImportResult(store=Path(store), format=get_format(format).name, arms=arms)


__all__ = [
    "DEFAULT_CHUNK_SIZE", "ImportFormatError", "ImportResult", "MissingSamplingError", "PickleRefusedError",
    "TrainerSpec", "coordinates", "formats", "import_to_store", "read", "require_sampling", "sampling_unknown", "select",
]
