"""The generic format for verl and custom loops: JSONL, Parquet or ``.npz`` (``GENERIC_FORMAT.md``).

One row per sampled sequence: ``input_ids`` (prompt + response), ``response_mask`` or
``prompt_length``, ``rollout_log_probs``; optional ``old_log_probs`` (the trainer's pi_old),
``temperature``, ``top_k``, ``top_p``, ``policy_version``, ``reward``, ``finish_reason``,
``step``, ``run``, ``split``, ``prompt_index``, ``sample_index``, ``prompt_text``,
``prompt_messages``. Per-token arrays either cover every token of ``input_ids`` or only the
response region (the tokens after the prompt: verl's layout). ``null`` on a sampled token is a
missing value, refused in ``rollout_log_probs`` and ``old_log_probs`` alike (never read as a
token of probability 0: write ``-Infinity``, as Python's ``json`` does, for that). One arm per (launch, run, split, step) (per file without ``step``).
A row without ``input_ids`` that is verl's ``rollout_data_dir`` dump or TRL's completions log
(decoded text only) is recognised and refused with the recipe that works.

``.npz`` holds the same names as 2-d arrays padded per row (``attention_mask`` marks the real
tokens, else ids < 0 are padding): verl's ``batch.batch`` saved as it is. ``.npz`` members are
read row-chunk by row-chunk from the zip, never whole; object arrays (which need pickle), float
ids holding NaN (no longer distinguishable from padding) and damaged members (bad CRC, corrupted
deflate stream, cut short) are refused.

``old_log_probs`` are taken as verl computes them (``verl/workers/actor/dp_actor.py``:
``logits.div_(temperature)`` with the rollout temperature, no top-k/top-p): the processed reading
when the sampler cut nothing; ``trainer_reading`` overrides that for other trainers.
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlparity.importers.errors import ImportFormatError
from rlparity.importers.reading import TrainerSpec
from rlparity.importers.records import ArmKey, Record
from rlparity.importers.sampling import SAMPLING_FIELDS, dump_sampling_value
from rlparity.importers.values import as_int, as_reward, floats, ints, natural_key, need, safe_arm
from rlparity.importers.formats import Format, ReadContext
from rlparity.importers.jsonl import iter_jsonl

TRAINER = TrainerSpec(
    field="old_log_probs", applies=frozenset({"temperature"}),
    source="volcengine/verl verl/workers/actor/dp_actor.py (compute_log_prob: logits.div_(temperature), "
           "no top-k/top-p)",
    note="old_log_probs taken as verl computes them: at the rollout temperature over the full vocabulary "
         "(pass trainer_reading / --trainer-reading if your trainer differs)")
PER_TOKEN = ("rollout_log_probs", "old_log_probs")
NAMES = {"rollout": "rollout_log_probs", "trainer": "old_log_probs", "entropy": "entropy"}
SUFFIXES = (".jsonl", ".parquet", ".npz")
NPZ_ROWS = 256
TEXT_FIELDS = ("finish_reason", "prompt_text", "prompt_messages", "run", "split")


def _scalar(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _text(row: Mapping[str, Any], name: str, where: str) -> str | None:
    value = _scalar(row.get(name))
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ImportFormatError(f"{where}: field {name!r} is {type(value).__name__} {value!r:.40}, not text")
    return value


TEXT_ONLY = {
    "verl": ("verl's rollout_data_dir dump ({step}.jsonl of RayPPOTrainer._dump_generations: decoded input/output "
             "text and score)", "'From verl' in rlparity/importers/GENERIC_FORMAT.md: five lines in RayPPOTrainer.fit save "
             "input_ids, attention_mask, response_mask, rollout_log_probs and old_log_probs as .npz"),
    "trl": ("TRL's completions log (completions_*.parquet of GRPOTrainer.log: decoded prompt/completion text, "
            "rewards, advantage)", "'From TRL' in rlparity/importers/GENERIC_FORMAT.md: a GRPOTrainer subclass saves "
            "prompt_ids, completion_ids, completion_mask, sampling_per_token_logps and old_per_token_logps as .npz"),
}


def _refuse_text_only(row: Mapping[str, Any], where: str) -> None:
    """A row without ``input_ids`` that is a peer's text-only log: say what it is and what works."""
    keys = set(map(str, row))
    peer = ("verl" if {"input", "output"} <= keys and keys & {"score", "gts"} else
            "trl" if {"prompt", "completion"} <= keys else None)
    if peer:
        what, recipe = TEXT_ONLY[peer]
        raise ImportFormatError(f"{where}: this is {what}: text only, no token ids or logprobs, so nothing to "
                                f"compare. Dump the tensors instead ({recipe}) and import that")


def _coords(row: Mapping[str, Any], where: str, default_label: str) -> tuple[ArmKey, dict]:
    step = as_int(_scalar(row.get("step")), where, "step")
    run = _text(row, "run", where)
    split = _text(row, "split", where) or "train"
    label = safe_arm(f"step_{step}") if step is not None else default_label
    if split != "train" and step is not None:
        label = safe_arm(f"{split}_{label}")
    return ArmKey(label=label, step=step, run=run, split=split), ({"step": step} if step is not None else {})


def parse_row(row: Mapping[str, Any], where: str, default_label: str, info: dict) -> Record:
    """One generic row (a JSON object, a Parquet row, a compacted ``.npz`` row) as a record.

    The sampled tokens come from ``response_mask`` (over all tokens or the last ones) or
    ``prompt_length``; per-token fields may cover all tokens or those after the prompt; a null
    ``old_log_probs`` is a missing value (NaN, refused on a sampled token by the value checks).

    Parameters
    ----------
    row : Mapping
        The row's fields (``input_ids``, ``response_mask`` or ``prompt_length``,
        ``rollout_log_probs``, optional ``old_log_probs``, ``policy_version``, sampling, reward...).
    where : str
        The file and row, for messages.
    default_label : str
        The arm label when the row records no ``step``.
    info : dict
        Per-file facts recorded in the arm's attrs (keys starting with ``_`` left out).

    Returns
    -------
    Record
        The row as a record.

    Raises
    ------
    ImportFormatError
        If the row is a peer's text-only log, lacks ``input_ids`` or the sampled-token marking,
        or a field is malformed or misaligned.
    """
    what = "a generic row has input_ids, response_mask or prompt_length, rollout_log_probs"
    if "input_ids" not in row:
        _refuse_text_only(row, where)
    ids = ints(need(row, "input_ids", where, what), where, "input_ids")
    n = len(ids)
    plen = as_int(_scalar(row.get("prompt_length")), where, "prompt_length", hi=n)
    mask = row.get("response_mask")
    sampled = np.zeros(n, dtype=bool)
    if mask is not None:
        m = ints(mask, where, "response_mask", mask=True).astype(bool)
        if len(m) == n:
            sampled = m
            start = plen if plen is not None else (int(np.argmax(m)) if m.any() else n)
        elif len(m) < n:
            start = n - len(m)
            sampled[start:] = m
        else:
            raise ImportFormatError(f"{where}: response_mask has {len(m)} entries, more than input_ids ({n})")
    elif plen is not None:
        start = plen
        sampled[start:] = True
    else:
        raise ImportFormatError(f"{where}: neither response_mask nor prompt_length: say which tokens of input_ids "
                                "the engine sampled (see GENERIC_FORMAT.md)")

    def per_token(name: str, values: Any, kind, **kw) -> np.ndarray:
        arr = kind(values, where, name, **kw)
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
    # a null is a missing value, not a probability-0 token (that is -Infinity): refused by check_values
    trainer = per_token("old_log_probs", old, floats) if old is not None else None
    pv = _scalar(row.get("policy_version"))
    if pv is not None and not isinstance(pv, (int, float, bool)):
        version: Any = per_token("policy_version", pv, ints)
        if (version[sampled] < 0).any():
            raise ImportFormatError(f"{where}: policy_version is negative on a sampled token: versions are >= 0")
    else:
        version = None if isinstance(pv, float) and math.isnan(pv) else as_int(pv, where, "policy_version")
    key, coords = _coords(row, where, default_label)
    messages = row.get("prompt_messages")
    if messages is not None and not isinstance(messages, str):
        if not (isinstance(messages, (list, tuple)) and all(isinstance(m, Mapping) and "role" in m for m in messages)):
            raise ImportFormatError(f"{where}: prompt_messages must be a list of chat messages "
                                    "({'role': ..., 'content': ...})")
        messages = json.dumps([dict(m) for m in messages])
    return Record(
        key=key, where=where, ids=ids, sampled=sampled, rollout=rollout, trainer=trainer, version=version,
        reward=as_reward(row.get("reward"), where), finish_reason=_text(row, "finish_reason", where),
        sampling={k: _scalar(row.get(k)) for k in SAMPLING_FIELDS},
        prompt_index=as_int(_scalar(row.get("prompt_index")), where, "prompt_index"),
        sample_index=as_int(_scalar(row.get("sample_index")), where, "sample_index"),
        prompt_text=_text(row, "prompt_text", where), prompt_messages=messages or None, names=NAMES,
        arm_info={**{k: v for k, v in info.items() if not k.startswith("_")}, **coords})


# --------------------------------------------------------------------------- JSONL / Parquet


def _read_jsonl(file: Path, ctx: ReadContext) -> Iterator[Record]:
    label, info = safe_arm(file.stem), {"file": str(file)}
    for lineno, obj in iter_jsonl(file, ctx.advance):
        where = f"{file}:{lineno}"
        if not isinstance(obj, dict):
            raise ImportFormatError(f"{where}: expected one JSON object per line, got {type(obj).__name__}")
        yield parse_row(obj, where, label, info)


def _read_parquet(file: Path, ctx: ReadContext) -> Iterator[Record]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'rlparity[io]' (or pyarrow), "
                          "or write JSONL/.npz instead") from None
    label, info = safe_arm(file.stem), {"file": str(file)}
    try:
        pf = pq.ParquetFile(file)
        total = max(pf.metadata.num_rows, 1)
        batches = pf.iter_batches(batch_size=NPZ_ROWS)
    except Exception as err:  # noqa: BLE001 - pyarrow raises its own types for damaged files
        raise ImportFormatError(f"{file}: not a readable Parquet file ({err})") from None
    size, done, row_no = file.stat().st_size, 0, 0
    while True:
        try:
            batch = next(batches, None)
            rows = None if batch is None else batch.to_pylist()
        except Exception as err:  # noqa: BLE001
            raise ImportFormatError(f"{file}: damaged Parquet file after row {row_no} ({err}): write it again") from None
        if rows is None:
            break
        for row in rows:
            yield parse_row(row, f"{file} [row {row_no}]", label, info)
            row_no += 1
        step = size * row_no // total - done
        done += step
        ctx.advance(step)


# --------------------------------------------------------------------------- .npz, streamed

#: what a damaged zip member raises while it is read (bad CRC, corrupted deflate stream, cut short)
DAMAGED = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError)


def _damaged(file: Path, member: str, err: Exception) -> ImportFormatError:
    return ImportFormatError(f"{file}: damaged .npz: member {member!r} cannot be read ({type(err).__name__}: {err}); "
                             "the file was cut short or corrupted: write it again")


class _Member:
    """One ``.npy`` member of an ``.npz``, read a few rows at a time."""

    def __init__(self, zf: zipfile.ZipFile, name: str, file: Path):
        self.name, self.file = name[:-4], file
        try:
            self.f = zf.open(name)
            version = np.lib.format.read_magic(self.f)
            reader = {(1, 0): np.lib.format.read_array_header_1_0,
                      (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if reader is None:
                raise ImportFormatError(f"{file}: member {name} has .npy format {version}, which rlparity does not read")
            self.shape, fortran, self.dtype = reader(self.f)
        except ImportFormatError:
            raise
        except Exception as err:  # noqa: BLE001 - a garbled header raises SyntaxError, TokenError, ...
            raise _damaged(file, self.name, err) from None
        if self.dtype.hasobject:
            raise ImportFormatError(f"{file}: member {self.name!r} is an object array, which needs pickle to load: "
                                    "refused; store numbers (pad ragged rows, mark padding with attention_mask)")
        self.scalar = len(self.shape) == 0
        self.row_items = int(np.prod(self.shape[1:])) if not self.scalar else 1
        self.whole: np.ndarray | None = None
        if fortran and not self.scalar:
            data = self._read(int(np.prod(self.shape))).reshape(self.shape, order="F")
            self.whole = np.ascontiguousarray(data)
        self.pos = 0

    def _read(self, items: int) -> np.ndarray:
        """``items`` values from the member; a short or damaged read names the member."""
        try:
            buf = self.f.read(items * self.dtype.itemsize)
            if len(buf) != items * self.dtype.itemsize:
                raise EOFError(f"{len(buf)} of {items * self.dtype.itemsize} bytes")
            return np.frombuffer(buf, dtype=self.dtype)
        except DAMAGED as err:
            raise _damaged(self.file, self.name, err) from None

    def value(self) -> Any:
        return self._read(1)[0]

    def rows(self, k: int) -> np.ndarray:
        if self.whole is not None:
            out = self.whole[self.pos: self.pos + k]
        else:
            k = min(k, self.shape[0] - self.pos)
            out = self._read(k * self.row_items).reshape((k, *self.shape[1:]))
        self.pos += len(out)
        return out


def _npz_rows(arrays: dict[str, np.ndarray], scalars: dict[str, Any], file: Path, first: int
              ) -> Iterator[tuple[str, dict]]:
    ids2 = arrays["input_ids"]
    width = ids2.shape[1]
    for r in range(ids2.shape[0]):
        where = f"{file} [row {first + r}]"
        if ids2.dtype.kind == "f" and np.isnan(ids2[r]).any():
            c = int(np.flatnonzero(np.isnan(ids2[r]))[0])
            raise ImportFormatError(f"{where}: input_ids holds NaN at column {c}: float ids with NaN cannot be told "
                                    "from padding (the tokens around it would be joined into one sequence); store "
                                    "integer ids and mark the real tokens with attention_mask")
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
                raise ImportFormatError(f"{where}: {name} has {v.shape[0]} columns, more than input_ids ({width})")
        yield where, row


def _read_npz(file: Path, ctx: ReadContext) -> Iterator[Record]:
    label, info = safe_arm(file.stem), {"file": str(file)}
    try:
        zf = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError) as err:
        raise ImportFormatError(f"{file}: not an .npz (zip) file ({err})") from None
    with zf:
        members = {m.name: m for m in (_Member(zf, n, file) for n in zf.namelist() if n.endswith(".npy"))}
        if "input_ids" not in members:
            raise ImportFormatError(f"{file}: no 'input_ids' array; members: {sorted(members)}")
        shape = members["input_ids"].shape
        if len(shape) != 2:
            raise ImportFormatError(f"{file}: input_ids must be 2-d (rows x tokens), got shape {shape}")
        n = shape[0]
        if "attention_mask" in members and members["attention_mask"].shape != shape:
            raise ImportFormatError(f"{file}: attention_mask has shape {members['attention_mask'].shape} but "
                                    f"input_ids {shape}: it must mark every column of input_ids")
        for k, m in members.items():
            if m.dtype.kind not in "biufU":
                raise ImportFormatError(f"{file}: member {k!r} has dtype {m.dtype}: store numbers (or text)")
        scalars = {k: _scalar(m.value()) for k, m in members.items() if m.scalar}
        rowwise = {k: m for k, m in members.items() if not m.scalar}
        for k, m in rowwise.items():
            if m.dtype.kind == "U" and k not in TEXT_FIELDS:
                raise ImportFormatError(f"{file}: member {k!r} holds text (dtype {m.dtype}), not numbers")
            if m.shape[0] != n:
                raise ImportFormatError(f"{file}: {k} has {m.shape[0]} rows but input_ids has {n}")
        for k in SAMPLING_FIELDS:
            if k in scalars:  # a file-level value must be a valid one (it decides the trainer reading)
                dump_sampling_value(k, scalars[k], str(file))
        info = {**info, "file_sampling": {k: scalars[k] for k in SAMPLING_FIELDS if k in scalars}}
        size, done, first = file.stat().st_size, 0, 0
        while first < n:
            chunk = {k: m.rows(NPZ_ROWS) for k, m in rowwise.items()}
            for where, row in _npz_rows(chunk, scalars, file, first):
                yield parse_row(row, where, label, info)
            first += len(chunk["input_ids"])
            step = size * first // max(n, 1) - done
            done += step
            ctx.advance(step)


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    """Read one generic (``.jsonl``, ``.parquet`` or ``.npz``) file into records.

    Parameters
    ----------
    file : pathlib.Path
        The file.
    ctx : ReadContext
        Its ``advance`` is called with the bytes read (progress).

    Returns
    -------
    iterator of Record
        One record per row of the file, read lazily.

    Raises
    ------
    ImportFormatError
        If the file or a record is malformed (the message names the file, the line or sample and
        the field), or the suffix is none of them.
    """
    suffix = file.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(file, ctx)
    if suffix == ".parquet":
        return _read_parquet(file, ctx)
    if suffix == ".npz":
        return _read_npz(file, ctx)
    raise ImportFormatError(f"{file}: the generic format reads {', '.join(SUFFIXES)} files")


def find_files(path: Path) -> list[Path]:
    """The dump files under ``path`` (the format's ``find_files``).

    Parameters
    ----------
    path : pathlib.Path
        A file (returned as is) or a folder.

    Returns
    -------
    list of pathlib.Path
        The ``.jsonl``, ``.parquet`` and ``.npz`` files under it, in natural order (``step_2`` before ``step_10``).
    """
    if path.is_file():
        return [path]
    return sorted((p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES), key=natural_key)


FORMAT = Format(
    name="generic", description="generic rows for verl and custom loops, .jsonl / .parquet / .npz "
                                "(input_ids, response_mask or prompt_length, rollout_log_probs, old_log_probs)",
    find_files=find_files, read_file=read_file, trainer=TRAINER,
    # files of one folder that record the same step are its parts (ranks, generation batches)
    shards=lambda key: key.step is not None)
