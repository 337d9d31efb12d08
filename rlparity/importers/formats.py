"""The registry of dump formats and the streaming driver of the importers.

The driver is shared by :func:`rlparity.importers.read` and :func:`rlparity.importers.import_to_store`.

One arm per (run, launch, split, step) of a dump: a format's reader gives every record an
:class:`~rlparity.importers.records.ArmKey` (run, split, step, from the record or the framework's own
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

from rlparity.importers.builder import ArmBuilder
from rlparity.importers.errors import ImportFormatError
from rlparity.importers.reading import TrainerSpec, decide_reading
from rlparity.importers.records import ArmKey, Record
from rlparity.importers.sampling import SamplingResolver


def _ignore_progress(n: int) -> None:
    """Report nothing (the default progress callback).

    Parameters
    ----------
    n : int
        Bytes read since the last call.
    """


def _parent_folder(file: Path) -> Path:
    """The folder a file lies in (the default launch folder).

    Parameters
    ----------
    file : pathlib.Path
        A dump file.

    Returns
    -------
    pathlib.Path
        ``file.parent``.
    """
    return file.parent


def _no_hint(path: Path) -> str:
    """No further hint when no file is found (the default).

    Parameters
    ----------
    path : pathlib.Path
        The path searched.

    Returns
    -------
    str
        ``""``.
    """
    return ""


@dataclass
class ReadContext:
    """What a format's reader gets besides the file: a progress callback.

    Parameters
    ----------
    advance : callable, optional
        Called with the bytes read since the last call; the default reports nothing.
    """

    advance: Callable[[int], None] = _ignore_progress


@dataclass(frozen=True)
class Format:
    """One dump format: how to find its files and read them into records, and what its values mean.

    Parameters
    ----------
    name : str
        The format's name (``prime-rl``, ``nemo-rl``...).
    description : str
        What it reads, in words.
    find_files : callable
        ``find_files(path)``: the dump files under ``path`` (or ``path`` itself), in order.
    read_file : callable
        ``read_file(file, ctx)``: the :class:`~rlparity.importers.records.Record` objects of one
        file (``ctx`` a :class:`ReadContext`).
    trainer : TrainerSpec, optional
        What the framework's trainer logprobs mean; ``None``: the dump has none.
    framework_sampling : dict, optional
        The framework's documented sampling defaults, ``{field: (value, source)}``.
    launch_of : callable, optional
        ``launch_of(file)``: the folder of the launch a file belongs to (default: its folder).
    shards : bool or callable, default False
        Whether one arm may span several files (a bool, or a function of the arm's key).
    prompt_tokenization : dict, optional
        How the framework tokenized prompt text (recorded when texts are kept).
    nothing_found : callable, optional
        ``nothing_found(path)``: a hint appended when no file is found (default: none).
    """

    name: str
    description: str
    find_files: Callable[[Path], list[Path]]
    read_file: Callable[[Path, ReadContext], Iterator[Record]]
    trainer: TrainerSpec | None = None
    framework_sampling: dict[str, tuple[Any, str]] = field(default_factory=dict)
    launch_of: Callable[[Path], Path] = _parent_folder
    shards: bool | Callable[[ArmKey], bool] = False
    prompt_tokenization: dict[str, Any] | None = None
    nothing_found: Callable[[Path], str] = _no_hint


FORMAT_MODULES = {"prime-rl": "primerl", "nemo-rl": "nemorl", "slime": "slime", "pipelinerl": "pipelinerl",
                  "generic": "generic"}
ALIASES = {"prime_rl": "prime-rl", "primerl": "prime-rl", "nemo_rl": "nemo-rl", "nemorl": "nemo-rl",
           "nemo": "nemo-rl", "pipeline-rl": "pipelinerl", "pipeline_rl": "pipelinerl", "verl": "generic"}


def get_format(name: str) -> Format:
    """The :class:`Format` called ``name`` (a few spellings accepted: ``prime_rl``, ``verl``).

    Parameters
    ----------
    name : str
        The format's name or an alias, case-insensitive.

    Returns
    -------
    Format
        The ``FORMAT`` of the format's module.

    Raises
    ------
    ValueError
        If the name is unknown (``trl`` gets a hint to export the generic format).
    """
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in FORMAT_MODULES:
        hint = (" (TRL's completions_*.parquet hold decoded text only: see 'From TRL' in GENERIC_FORMAT.md for "
                "the dump that works, then import it as generic)") if key == "trl" else ""
        raise ValueError(f"unknown format {name!r}; rlparity imports {', '.join(FORMAT_MODULES)}{hint}")
    return importlib.import_module(f"rlparity.importers.{FORMAT_MODULES[key]}").FORMAT


def launch_labels(files: list[Path], launch_of: Callable[[Path], Path]) -> dict[Path, str]:
    """Each file's launch: its launch folder relative to the folder the launches share.

    Parameters
    ----------
    files : list of pathlib.Path
        The dump's files.
    launch_of : callable
        ``launch_of(file)``: the file's launch folder (:attr:`Format.launch_of`).

    Returns
    -------
    dict of pathlib.Path to str
        Per file its launch label: ``""`` when all files come from one launch, ``"."`` for the
        shared folder itself.
    """
    dirs = {f: Path(os.path.abspath(launch_of(f))) for f in files}
    if len(set(dirs.values())) <= 1:
        return {f: "" for f in files}
    common = Path(os.path.commonpath([str(d) for d in dirs.values()]))
    return {f: str(d.relative_to(common)) for f, d in dirs.items()}


def refuse_case_twins(files: list[Path]) -> None:
    """Refuse two files whose paths differ only in case.

    On a case-insensitive filesystem (macOS, Windows) they are one file, and their arms would collide.

    Parameters
    ----------
    files : list of pathlib.Path
        The dump's files.

    Raises
    ------
    ImportFormatError
        Naming the two files.
    """
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
    """Read every file of ``path`` and yield ``(arm, chunk)`` as chunks fill up.

    Parameters
    ----------
    fmt : Format
        The dump's format.
    path : str or pathlib.Path
        A dump file or a folder of them.
    sampling : SamplingResolver
        Resolves each record's sampling parameters.
    trainer_reading : str or None
        The user's override of where the trainer logprobs go (:func:`rlparity.importers.reading.decide_reading`).
    chunk_size : int
        Sequences per chunk (>= 1).
    progress : bool
        Show a progress bar (bytes read).
    builders : dict of str to ArmBuilder
        Filled with one :class:`~rlparity.importers.builder.ArmBuilder` per arm (their final
        attrs are read afterwards).

    Yields
    ------
    tuple of (str, xarray.Dataset)
        ``(arm, trace chunk)``; the last chunk of every arm comes after all files are read.

    Raises
    ------
    ValueError
        If ``chunk_size < 1``.
    FileNotFoundError
        If ``path`` does not exist.
    ImportFormatError
        If no file is found, two files hold the same arm (and the format has no shards), two arm
        or file names differ only in case, a record is malformed, or no sample holds a sampled token.
    """
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
