"""The registry of dump formats and the streaming driver shared by :func:`rlparity.importers.read` and
:func:`rlparity.importers.import_to_store`.

One arm per (run, launch, split, step) of a dump: a format's reader gives every record an
:class:`~rlparity.importers.common.ArmKey` (run, split, step, from the record or the framework's own
layout) and the driver adds the launch, the folder a file came from (``exp_001`` and ``exp_002``
of two NeMo-RL launches are two arms). The key is stored as the arm's coordinates; the arm name is
only a label built from it, never parsed back. Two files that hold the same key are refused with
both names, unless the format writes one arm as several files (prime-rl ranks, PipelineRL
partitions, generic files that record the same step); two arm names or file names that differ
only in case are refused as well.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.importers.common import ArmBuilder, ArmKey, ImportFormatError, Record, SamplingResolver, TrainerSpec, decide_reading


@dataclass
class ReadContext:
    """What a format's reader gets besides the file: a progress callback (bytes done)."""

    advance: Callable[[int], None] = lambda n: None


@dataclass(frozen=True)
class Format:
    """One dump format: how to find its files, read them into records, where a launch's folder
    is, whether one arm may span several files (``shards``: a bool, or a function of the arm's
    key), what its trainer logprobs mean and how the framework tokenized prompt text."""

    name: str
    description: str
    find_files: Callable[[Path], list[Path]]
    read_file: Callable[[Path, ReadContext], Iterator[Record]]
    trainer: TrainerSpec | None = None
    framework_sampling: dict[str, tuple[Any, str]] = field(default_factory=dict)
    launch_of: Callable[[Path], Path] = lambda file: file.parent
    shards: bool | Callable[[ArmKey], bool] = False
    prompt_tokenization: dict[str, Any] | None = None
    nothing_found: Callable[[Path], str] = lambda path: ""


FORMAT_MODULES = {"prime-rl": "primerl", "nemo-rl": "nemorl", "slime": "slime", "pipelinerl": "pipelinerl",
                  "generic": "generic"}
ALIASES = {"prime_rl": "prime-rl", "primerl": "prime-rl", "nemo_rl": "nemo-rl", "nemorl": "nemo-rl",
           "nemo": "nemo-rl", "pipeline-rl": "pipelinerl", "pipeline_rl": "pipelinerl", "verl": "generic"}


def get_format(name: str) -> Format:
    """The :class:`Format` called ``name`` (a few spellings accepted: ``prime_rl``, ``verl``)."""
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in FORMAT_MODULES:
        hint = (" (TRL's completions_*.parquet hold decoded text only: see 'From TRL' in GENERIC_FORMAT.md for "
                "the dump that works, then import it as generic)") if key == "trl" else ""
        raise ValueError(f"unknown format {name!r}; rlparity imports {', '.join(FORMAT_MODULES)}{hint}")
    return importlib.import_module(f"rlparity.importers.{FORMAT_MODULES[key]}").FORMAT


def launch_labels(files: list[Path], launch_of: Callable[[Path], Path]) -> dict[Path, str]:
    """Each file's launch: its launch folder relative to the folder the launches share (``""``
    when all files come from one launch, ``"."`` for the shared folder itself)."""
    dirs = {f: Path(os.path.abspath(launch_of(f))) for f in files}
    if len(set(dirs.values())) <= 1:
        return {f: "" for f in files}
    common = Path(os.path.commonpath([str(d) for d in dirs.values()]))
    return {f: str(d.relative_to(common)) for f, d in dirs.items()}


def refuse_case_twins(files: list[Path]) -> None:
    """Two files whose paths differ only in case cannot both be imported: on a case-insensitive
    filesystem (macOS, Windows) they are one file, and their arms would collide."""
    seen: dict[str, Path] = {}
    for f in files:
        other = seen.setdefault(str(f).lower(), f)
        if other != f:
            raise ImportFormatError(f"{other} and {f} differ only in case: on a case-insensitive filesystem they are "
                                    "one file and their arms would collide; rename one (or import them separately)")


def _coords(key: ArmKey) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in key.coords().items() if v not in (None, ""))


def stream_chunks(fmt: Format, path: str | Path, *, sampling: SamplingResolver, trainer_reading: str | None,
                  chunk_size: int, progress: bool, builders: dict[str, ArmBuilder]
                  ) -> Iterator[tuple[str, xr.Dataset]]:
    """Read every file of ``path`` and yield ``(arm, chunk)`` as chunks fill up; ``builders``
    is filled with one :class:`ArmBuilder` per arm (their final attrs are read afterwards)."""
    from tqdm.auto import tqdm

    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size}: give a positive number of sequences per chunk")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    files = fmt.find_files(path)
    if not files:
        raise ImportFormatError(f"{path}: no {fmt.name} files found ({fmt.description}){fmt.nothing_found(path)}")
    refuse_case_twins(files)
    launches = launch_labels(files, fmt.launch_of)
    names: dict[ArmKey, str] = {}
    owner: dict[ArmKey, Path] = {}
    by_name: dict[str, ArmKey] = {}  # lower-case arm name -> its key
    total = sum(f.stat().st_size for f in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"import {fmt.name}", disable=not progress) as bar:
        ctx = ReadContext(advance=bar.update)
        for file in files:
            for rec in fmt.read_file(file, ctx):
                key = replace(rec.key, launch=launches[file])
                name = names.get(key)
                if name is None:
                    name = key.name()
                    twin = by_name.get(name.lower())
                    if twin is not None:
                        raise ImportFormatError(
                            f"{rec.where}: this sample's arm ({_coords(key)}) would be named {name!r}, like the arm "
                            f"of {owner[twin]} ({_coords(twin)}) up to case: import the two separately")
                    uniform = sampling.uniform(rec.arm_info.get("file_sampling"))
                    reading = decide_reading(fmt.trainer, uniform, trainer_reading) if fmt.trainer else "none"
                    builders[name] = ArmBuilder(
                        arm=name, key=key, fmt=fmt.name, trainer_spec=fmt.trainer, reading=reading, sampling=sampling,
                        chunk_size=chunk_size, prompt_tokenization=fmt.prompt_tokenization)
                    names[key], owner[key], by_name[name.lower()] = name, file, key
                b = builders[name]
                if str(file) not in b.files:
                    if b.files and not (fmt.shards(key) if callable(fmt.shards) else fmt.shards):
                        raise ImportFormatError(
                            f"{rec.where}: {file} and {owner[key]} both hold arm {name!r} ({_coords(key)}): one arm is "
                            f"one (run, launch, split, step) of one {fmt.name} file; import them separately, or move "
                            "one into its own folder (its launch)")
                    b.files.append(str(file))
                for chunk in b.add(rec):
                    yield name, chunk
        for name, b in builders.items():
            chunk = b.flush()
            if chunk is not None:
                yield name, chunk
    if not any(b.n_sequences for b in builders.values()):
        excluded = sorted({e["reason"] for b in builders.values() for e in b.excluded.values()})
        n = sum(b.n_records for b in builders.values())
        raise ImportFormatError(f"{path}: nothing to import: none of its {n} sample(s) holds a token the engine "
                                "sampled and the framework trains with RL"
                                + (f" (left out: {'; '.join(excluded)})" if excluded else ""))
