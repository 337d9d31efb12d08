"""The registry of dump formats and the streaming driver shared by :func:`rlparity.io.read` and
:func:`rlparity.io.import_to_store`."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.io.common import ArmBuilder, ImportFormatError, Record, SamplingResolver, TrainerSpec, decide_reading


@dataclass
class ReadContext:
    """What a format's reader gets besides the file: a progress callback (bytes done)."""

    advance: Callable[[int], None] = lambda n: None


@dataclass(frozen=True)
class Format:
    """One dump format: how to find its files, read them into records, and what its trainer
    logprobs mean."""

    name: str
    description: str
    find_files: Callable[[Path], list[Path]]
    read_file: Callable[[Path, ReadContext], Iterator[Record]]
    trainer: TrainerSpec | None = None
    framework_sampling: dict[str, tuple[Any, str]] = field(default_factory=dict)
    rollout_only_hint: str = ""


FORMAT_MODULES = {"prime-rl": "primerl", "nemo-rl": "nemorl", "slime": "slime", "pipelinerl": "pipelinerl",
                  "generic": "generic"}
ALIASES = {"prime_rl": "prime-rl", "primerl": "prime-rl", "nemo_rl": "nemo-rl", "nemorl": "nemo-rl",
           "nemo": "nemo-rl", "pipeline-rl": "pipelinerl", "pipeline_rl": "pipelinerl", "verl": "generic"}


def get_format(name: str) -> Format:
    """The :class:`Format` called ``name`` (a few spellings accepted: ``prime_rl``, ``verl``)."""
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in FORMAT_MODULES:
        raise ValueError(f"unknown format {name!r}; rlparity imports {', '.join(FORMAT_MODULES)}")
    return importlib.import_module(f"rlparity.io.{FORMAT_MODULES[key]}").FORMAT


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
        raise ImportFormatError(f"{path}: no {fmt.name} files found ({fmt.description})")
    total = sum(f.stat().st_size for f in files)
    owner: dict[str, Path] = {}
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"import {fmt.name}", disable=not progress) as bar:
        ctx = ReadContext(advance=bar.update)
        for file in files:
            for rec in fmt.read_file(file, ctx):
                b = builders.get(rec.arm)
                if b is None:
                    if rec.arm in owner and owner[rec.arm] != file:
                        raise ImportFormatError(f"{rec.where}: arm {rec.arm!r} also comes from {owner[rec.arm]}; "
                                                "import the files separately or give them distinct steps/names")
                    uniform = sampling.uniform(rec.arm_info.get("file_sampling"))
                    reading = decide_reading(fmt.trainer, uniform, trainer_reading) if fmt.trainer else "none"
                    b = builders[rec.arm] = ArmBuilder(
                        arm=rec.arm, fmt=fmt.name, trainer_spec=fmt.trainer, reading=reading, sampling=sampling,
                        arm_info=dict(rec.arm_info), chunk_size=chunk_size)
                    owner[rec.arm] = file
                if str(file) not in b.files:
                    b.files.append(str(file))
                for chunk in b.add(rec):
                    yield rec.arm, chunk
        for arm, b in builders.items():
            chunk = b.flush()
            if chunk is not None:
                yield arm, chunk
