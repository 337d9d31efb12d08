"""The generic format for verl and custom loops: JSONL, Parquet or ``.npz`` (``GENERIC_FORMAT.md``).

One row per sampled sequence: ``input_ids`` (prompt + response), ``response_mask`` or
``prompt_length``, ``rollout_log_probs``; optional ``old_log_probs`` (the trainer's pi_old),
``temperature``, ``top_k``, ``top_p``, ``policy_version``, ``reward``, ``finish_reason``,
``step``, ``prompt_index``, ``sample_index``. Per-token arrays either cover every token of
``input_ids`` or only the response region (the tokens after the prompt: verl's layout).

``.npz`` holds the same names as 2-d arrays padded per row (``attention_mask`` marks the real
tokens, else ids < 0 are padding): verl's ``batch.batch`` saved as it is. ``.npz`` members are
read row-chunk by row-chunk from the zip, never whole; object arrays (which need pickle) are
refused.

``old_log_probs`` are taken as verl computes them (``verl/workers/actor/dp_actor.py``:
``logits.div_(temperature)`` with the rollout temperature, no top-k/top-p): the processed reading
when the sampler cut nothing; ``trainer_reading`` overrides that for other trainers.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlparity.io.common import (
    SAMPLING_FIELDS,
    ImportFormatError,
    Record,
    TrainerSpec,
    floats,
    ints,
    natural_key,
    need,
    safe_arm,
)
from rlparity.io.formats import Format, ReadContext
from rlparity.io.jsonl import iter_jsonl

TRAINER = TrainerSpec(
    field="old_log_probs", applies=frozenset({"temperature"}),
    source="volcengine/verl verl/workers/actor/dp_actor.py (compute_log_prob: logits.div_(temperature), "
           "no top-k/top-p)",
    note="old_log_probs taken as verl computes them: at the rollout temperature over the full vocabulary "
         "(pass trainer_reading / --trainer-reading if your trainer differs)")
PER_TOKEN = ("rollout_log_probs", "old_log_probs")
SUFFIXES = (".jsonl", ".parquet", ".npz")
NPZ_ROWS = 256


def _scalar(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def parse_row(row: Mapping[str, Any], where: str, default_arm: str, info: dict) -> Record:
    """One generic row (a JSON object, a Parquet row, a compacted ``.npz`` row) -> a record."""
    what = "a generic row has input_ids, response_mask or prompt_length, rollout_log_probs"
    ids = ints(need(row, "input_ids", where, what), where, "input_ids")
    n = len(ids)
    plen = _scalar(row.get("prompt_length"))
    mask = row.get("response_mask")
    sampled = np.zeros(n, dtype=bool)
    if mask is not None:
        m = ints(mask, where, "response_mask").astype(bool)
        if len(m) == n:
            sampled = m
            start = int(plen) if plen is not None else (int(np.argmax(m)) if m.any() else n)
        elif len(m) < n:
            start = n - len(m)
            sampled[start:] = m
        else:
            raise ImportFormatError(f"{where}: response_mask has {len(m)} entries, more than input_ids ({n})")
    elif plen is not None:
        start = int(plen)
        if not 0 <= start <= n:
            raise ImportFormatError(f"{where}: prompt_length={start} but input_ids has {n} tokens")
        sampled[start:] = True
    else:
        raise ImportFormatError(f"{where}: neither response_mask nor prompt_length: say which tokens of input_ids "
                                "the engine sampled (see GENERIC_FORMAT.md)")

    def per_token(name: str, values: Any, kind) -> np.ndarray:
        arr = kind(values, where, name)
        if len(arr) == n:
            return arr
        if len(arr) == n - start:
            fill = np.nan if kind is floats else 0
            out = np.full(n, fill, dtype=arr.dtype)
            out[start:] = arr
            return out
        raise ImportFormatError(f"{where}: {name} has {len(arr)} entries: give one per token of input_ids ({n}) "
                                f"or one per token after the prompt ({n - start})")

    rollout = per_token("rollout_log_probs", need(row, "rollout_log_probs", where, what), floats)
    old = row.get("old_log_probs")
    trainer = per_token("old_log_probs", old, floats) if old is not None else None
    pv = row.get("policy_version")
    pv = _scalar(pv)
    if pv is not None and not _is_number(pv):
        version: Any = per_token("policy_version", pv, ints)
    else:
        version = None if pv is None or (isinstance(pv, float) and math.isnan(pv)) else int(pv)
    step = _scalar(row.get("step"))
    arm = safe_arm(f"step_{int(step)}") if step is not None else default_arm
    reward = _scalar(row.get("reward"))
    finish = _scalar(row.get("finish_reason"))
    return Record(
        arm=arm, where=where, ids=ids, sampled=sampled, rollout=rollout, trainer=trainer, version=version,
        reward=None if reward is None else float(reward), finish_reason=None if finish in (None, "") else str(finish),
        sampling={k: _scalar(row.get(k)) for k in SAMPLING_FIELDS},
        prompt_index=int(_scalar(row.get("prompt_index", info.get("_row", 0)))),
        sample_index=int(_scalar(row.get("sample_index", 0))),
        arm_info={**{k: v for k, v in info.items() if not k.startswith("_")},
                  **({"step": int(step)} if step is not None else {})})


# --------------------------------------------------------------------------- JSONL / Parquet


def _read_jsonl(file: Path, ctx: ReadContext) -> Iterator[Record]:
    arm, info = safe_arm(file.stem), {"file": str(file)}
    for row_no, (lineno, obj) in enumerate(iter_jsonl(file, ctx.advance)):
        where = f"{file}:{lineno}"
        if not isinstance(obj, dict):
            raise ImportFormatError(f"{where}: expected one JSON object per line, got {type(obj).__name__}")
        yield parse_row(obj, where, arm, {**info, "_row": row_no})


def _read_parquet(file: Path, ctx: ReadContext) -> Iterator[Record]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'rlparity[io]' (or pyarrow), "
                          "or write JSONL/.npz instead") from None
    arm, info = safe_arm(file.stem), {"file": str(file)}
    try:
        pf = pq.ParquetFile(file)
    except Exception as err:
        raise ImportFormatError(f"{file}: not a readable Parquet file ({err})") from None
    total = max(pf.metadata.num_rows, 1)
    size, done, row_no = file.stat().st_size, 0, 0
    for batch in pf.iter_batches(batch_size=NPZ_ROWS):
        for row in batch.to_pylist():
            yield parse_row(row, f"{file} [row {row_no}]", arm, {**info, "_row": row_no})
            row_no += 1
        step = size * row_no // total - done
        done += step
        ctx.advance(step)


# --------------------------------------------------------------------------- .npz, streamed


class _Member:
    """One ``.npy`` member of an ``.npz``, read a few rows at a time."""

    def __init__(self, zf: zipfile.ZipFile, name: str, file: Path):
        self.name = name[:-4]
        self.f = zf.open(name)
        version = np.lib.format.read_magic(self.f)
        reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if reader is None:
            raise ImportFormatError(f"{file}: member {name} has .npy format {version}, which rlparity does not read")
        self.shape, fortran, self.dtype = reader(self.f)
        if self.dtype.hasobject:
            raise ImportFormatError(f"{file}: member {self.name!r} is an object array, which needs pickle to load: "
                                    "refused; store numbers (pad ragged rows, mark padding with attention_mask)")
        self.scalar = len(self.shape) == 0
        if fortran and not self.scalar:
            data = np.frombuffer(self.f.read(), dtype=self.dtype).reshape(self.shape, order="F")
            self.whole: np.ndarray | None = np.ascontiguousarray(data)
        else:
            self.whole = None
        self.row_items = int(np.prod(self.shape[1:])) if not self.scalar else 1
        self.pos = 0

    def value(self) -> Any:
        return np.frombuffer(self.f.read(self.dtype.itemsize), dtype=self.dtype)[0]

    def rows(self, k: int) -> np.ndarray:
        if self.whole is not None:
            out = self.whole[self.pos: self.pos + k]
        else:
            k = min(k, self.shape[0] - self.pos)
            buf = self.f.read(k * self.row_items * self.dtype.itemsize)
            out = np.frombuffer(buf, dtype=self.dtype).reshape((k, *self.shape[1:]))
        self.pos += len(out)
        return out


def _npz_rows(arrays: dict[str, np.ndarray], scalars: dict[str, Any], file: Path, first: int
              ) -> Iterator[tuple[str, dict]]:
    ids2 = arrays["input_ids"]
    width = ids2.shape[1]
    for r in range(ids2.shape[0]):
        real = arrays["attention_mask"][r].astype(bool) if "attention_mask" in arrays else ids2[r] >= 0
        row: dict[str, Any] = dict(scalars)
        for name, arr in arrays.items():
            if name == "attention_mask":
                continue
            v = arr[r]
            if v.ndim == 0:
                row[name] = v.item()
            elif v.shape[0] == width:
                row[name] = v[real]
            elif v.shape[0] < width:
                row[name] = v[real[width - v.shape[0]:]]
            else:
                raise ImportFormatError(f"{file} [row {first + r}]: {name} has {v.shape[0]} columns, more than "
                                        f"input_ids ({width})")
        yield f"{file} [row {first + r}]", row


def _read_npz(file: Path, ctx: ReadContext) -> Iterator[Record]:
    arm, info = safe_arm(file.stem), {"file": str(file)}
    try:
        zf = zipfile.ZipFile(file)
    except zipfile.BadZipFile as err:
        raise ImportFormatError(f"{file}: not an .npz (zip) file ({err})") from None
    with zf:
        members = {m.name: m for m in (_Member(zf, n, file) for n in zf.namelist() if n.endswith(".npy"))}
        if "input_ids" not in members:
            raise ImportFormatError(f"{file}: no 'input_ids' array; members: {sorted(members)}")
        n = members["input_ids"].shape[0] if len(members["input_ids"].shape) == 2 else -1
        if n < 0:
            raise ImportFormatError(f"{file}: input_ids must be 2-d (rows x tokens), got shape {members['input_ids'].shape}")
        scalars = {k: _scalar(m.value()) for k, m in members.items() if m.scalar}
        rowwise = {k: m for k, m in members.items() if not m.scalar}
        for k, m in rowwise.items():
            if m.shape[0] != n:
                raise ImportFormatError(f"{file}: {k} has {m.shape[0]} rows but input_ids has {n}")
        info = {**info, "file_sampling": {k: scalars[k] for k in SAMPLING_FIELDS if k in scalars}}
        size, done, first = file.stat().st_size, 0, 0
        while first < n:
            chunk = {k: m.rows(NPZ_ROWS) for k, m in rowwise.items()}
            for j, (where, row) in enumerate(_npz_rows(chunk, scalars, file, first)):
                yield parse_row(row, where, arm, {**info, "_row": first + j})
            first += len(chunk["input_ids"])
            step = size * first // max(n, 1) - done
            done += step
            ctx.advance(step)


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    suffix = file.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(file, ctx)
    if suffix == ".parquet":
        return _read_parquet(file, ctx)
    if suffix == ".npz":
        return _read_npz(file, ctx)
    raise ImportFormatError(f"{file}: the generic format reads {', '.join(SUFFIXES)} files")


def find_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted((p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES), key=natural_key)


FORMAT = Format(
    name="generic", description="generic rows for verl and custom loops, .jsonl / .parquet / .npz "
                                "(input_ids, response_mask or prompt_length, rollout_log_probs, old_log_probs)",
    find_files=find_files, read_file=read_file, trainer=TRAINER)
