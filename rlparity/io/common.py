"""What every importer shares: records, sampling parameters asked (never invented), the trainer
reading a framework's own logprobs stand for, and the chunked build of ordinary traces.

A format module turns a file into :class:`Record` objects (one sample of the dump: its token ids,
which of them the engine sampled, and the per-token arrays aligned with the ids). Everything
after that is common: :func:`split_record` cuts a record into engine-sampled sequences (a
multi-turn sample whose tool/user tokens sit between assistant turns gives one sequence per
assistant turn, its prompt being everything before it), and :class:`ArmBuilder` collects them
into chunks of ordinary traces through :func:`rlparity.trace.from_rollouts` and
:func:`rlparity.trace.with_trainer`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace import from_rollouts, pad_rows, validate, with_trainer

SAMPLING_FIELDS = ("temperature", "top_k", "top_p")
#: how a sampling parameter nobody gave is stored: NaN for floats, -1 for top_k (0 = off)
UNKNOWN_VALUE = {"temperature": math.nan, "top_k": -1, "top_p": math.nan}
OPTION_FLAG = {"temperature": "--temperature 0.7", "top_k": "--top-k 50", "top_p": "--top-p 0.95"}
OPTION_KWARG = {"temperature": "temperature=0.7", "top_k": "top_k=50", "top_p": "top_p=0.95"}
TRAINER_READINGS = ("processed", "raw", "none")
READING_VARIABLES = {
    "processed": ("trainer_processed_logprob", "trainer_processed_entropy"),
    "raw": ("trainer_logprob", "trainer_entropy"),
}


class ImportFormatError(ValueError):
    """A dump cannot be read as the named format; the message names the file, the line (or
    sample) and the field, and says how to fix it."""


class PickleRefusedError(ImportFormatError):
    """A ``.pt`` file needs full pickle (arbitrary code) to load: rlparity refuses it."""


class MissingSamplingError(ValueError):
    """A check needs a sampling parameter the dump did not record and nobody supplied."""


# --------------------------------------------------------------------------- sampling parameters


def check_sampling_option(name: str, value: Any) -> Any:
    """Validate a user-supplied sampling parameter; ``None`` means not given. ``top_k`` of -1
    (vLLM's "off") is stored as 0, the schema's "off"."""
    if value is None:
        return None
    if name == "temperature":
        v = float(value)
        if not v >= 0.0:
            raise ValueError(f"temperature={value!r}: give the sampling temperature, >= 0 (e.g. {OPTION_FLAG[name]})")
        return v
    if name == "top_k":
        if isinstance(value, float) and not float(value).is_integer():
            raise ValueError(f"top_k={value!r}: give an integer (0 or -1 = off)")
        v = int(value)
        if v < -1:
            raise ValueError(f"top_k={value!r}: give 0 (off) or a positive integer")
        return max(v, 0)
    if name == "top_p":
        v = float(value)
        if not 0.0 < v <= 1.0:
            raise ValueError(f"top_p={value!r}: give a value in (0, 1] (1 = off)")
        return v
    raise KeyError(name)


def dump_sampling_value(name: str, value: Any, where: str) -> Any:
    """A sampling parameter read from a dump, normalised (``None`` = the dump does not say)."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    try:
        if name == "top_k" and int(value) == -1:
            return 0
        return check_sampling_option(name, value)
    except (TypeError, ValueError) as err:
        raise ImportFormatError(f"{where}: field {name!r} = {value!r} is not a valid sampling parameter ({err})") from None


@dataclass
class SamplingResolver:
    """Per-sequence sampling parameters: the dump's own value, else the user's option, else the
    framework's documented default, else unknown (recorded, never guessed).

    A user option that contradicts the dump is an error: the dump says what ran.
    """

    user: dict[str, Any]
    framework: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.user = {k: check_sampling_option(k, v) for k, v in self.user.items() if v is not None}

    def uniform(self, file_values: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The values every sequence of a file shares (user option, file-level value, framework
        default); a field missing here varies per record or is unknown."""
        out = {k: v for k, (v, _) in self.framework.items()}
        out.update({k: v for k, v in (file_values or {}).items() if v is not None})
        out.update(self.user)
        return out

    def resolve(self, dump: Mapping[str, Any], where: str) -> tuple[dict[str, Any], set[str], set[str]]:
        """``(values, unknown fields, fields taken from the framework default)`` for one record."""
        values: dict[str, Any] = {}
        unknown: set[str] = set()
        from_framework: set[str] = set()
        for name in SAMPLING_FIELDS:
            d = dump_sampling_value(name, dump.get(name), where)
            u = self.user.get(name)
            if d is not None:
                if u is not None and not _same(d, u):
                    flag = OPTION_FLAG[name].split()[0]
                    raise ImportFormatError(
                        f"{where}: the dump records {name}={d!r} but {flag} {u!r} was given: drop the option "
                        "(the dump says what ran) or import the file it belongs to")
                values[name] = d
            elif u is not None:
                values[name] = u
            elif name in self.framework:
                values[name] = self.framework[name][0]
                from_framework.add(name)
            else:
                values[name] = UNKNOWN_VALUE[name]
                unknown.add(name)
        return values, unknown, from_framework


def _same(a: Any, b: Any) -> bool:
    return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))


def sampling_unknown(trace: xr.Dataset) -> list[str]:
    """The sampling parameters an imported trace does not know (the dump lacked them and no
    option gave them). Stored as NaN (temperature, top_p) and -1 (top_k) and listed in
    ``attrs["sampling_unknown"]``."""
    listed = list(trace.attrs.get("sampling_unknown") or [])
    found = set(listed)
    if "temperature" in trace and np.isnan(trace["temperature"].values).any():
        found.add("temperature")
    if "top_p" in trace and np.isnan(trace["top_p"].values).any():
        found.add("top_p")
    return [f for f in SAMPLING_FIELDS if f in found]


def require_sampling(trace: xr.Dataset, fields: Sequence[str] = SAMPLING_FIELDS, *, needed_for: str = "this check"
                     ) -> None:
    """Raise :class:`MissingSamplingError` naming each field in ``fields`` the trace does not
    know, and how to supply it when importing (the option, with an example value)."""
    missing = [f for f in sampling_unknown(trace) if f in fields]
    if not missing:
        return
    src = (trace.attrs.get("import") or {}).get("file") or "the dump"
    fmt = (trace.attrs.get("import") or {}).get("format") or "FORMAT"
    flags = " ".join(OPTION_FLAG[f] for f in missing)
    kwargs = ", ".join(OPTION_KWARG[f] for f in missing)
    raise MissingSamplingError(
        f"{needed_for} needs {', '.join(missing)}, which {src} does not record: re-import with the values "
        f"your run used, e.g. `rlparity import {fmt} PATH -o STORE {flags}` "
        f"(rlparity.io.read({fmt!r}, path, {kwargs}))")


# --------------------------------------------------------------------------- trainer reading


@dataclass(frozen=True)
class TrainerSpec:
    """How a framework computes the trainer logprobs it dumps.

    ``applies`` lists the sampler steps its trainer applies to the logits before the log-softmax
    (``temperature``, ``top_k``, ``top_p``, renormalised); ``source`` names the public file read to
    decide it.
    """

    field: str
    applies: frozenset[str]
    source: str
    note: str = ""


def decide_reading(spec: TrainerSpec, uniform: Mapping[str, Any], override: str | None) -> str:
    """Which schema reading the framework's trainer logprobs are: ``"processed"``,
    ``"raw"``, ``"both"`` (temperature 1 and no top-k/top-p, known for the whole file: the two
    coincide) or ``"none"`` (the user dropped them).

    A trainer that applies the sampling temperature computes the processed reading whenever the
    sampler cut nothing it does not cut itself; sequences where it does not are counted and noted
    (see :meth:`ArmBuilder.trainer_attrs`).
    """
    if override is not None:
        if override not in TRAINER_READINGS:
            raise ValueError(f"trainer_reading={override!r}; use one of {TRAINER_READINGS} (or leave it unset)")
        return override
    t, k, p = uniform.get("temperature"), uniform.get("top_k"), uniform.get("top_p")
    identity = t is not None and not math.isnan(t) and abs(t - 1.0) < 1e-9 and k == 0 and p is not None and p >= 1.0
    if identity:
        return "both"
    if "temperature" not in spec.applies:
        return "raw"
    return "processed"


# --------------------------------------------------------------------------- records


@dataclass
class Record:
    """One sample of a dump, before it is cut into engine-sampled sequences.

    Arrays are aligned with ``ids`` (the prompt and every later token): ``sampled`` marks the
    tokens the engine sampled; ``rollout`` / ``trainer`` / ``entropy`` hold a value at those
    tokens (NaN = the dump's null). ``version`` is one policy version for the sample, one per
    token, or ``None`` (not recorded); ``turn_versions`` one per assistant turn.
    """

    arm: str
    where: str
    ids: np.ndarray
    sampled: np.ndarray
    rollout: np.ndarray
    trainer: np.ndarray | None = None
    entropy: np.ndarray | None = None
    version: int | np.ndarray | None = None
    turn_versions: list[int] | None = None
    reward: float | None = None
    finish_reason: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    prompt_index: int = 0
    sample_index: int = 0
    arm_info: dict[str, Any] = field(default_factory=dict)


def floats(values: Any, where: str, name: str) -> np.ndarray:
    """A 1-d float64 array from a list that may hold ``None`` (JSON null -> NaN)."""
    try:
        if hasattr(values, "detach"):  # a torch tensor
            values = values.detach().to("cpu").double().numpy()
        try:
            return np.asarray(values, dtype=np.float64).reshape(-1)
        except TypeError:  # nulls
            return np.array([np.nan if v is None else v for v in values], dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise ImportFormatError(f"{where}: field {name!r} is not a list of numbers ({err})") from None


def ints(values: Any, where: str, name: str) -> np.ndarray:
    """A 1-d int64 array (token ids, masks)."""
    try:
        if hasattr(values, "detach"):
            values = values.detach().to("cpu").numpy()
        arr = np.asarray(values)
        if arr.dtype == bool:
            return arr.astype(np.int64).reshape(-1)
        if arr.dtype.kind == "f":
            if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
                raise ValueError("non-integer values")
        elif arr.dtype.kind not in "iu":
            raise ValueError(f"values of type {arr.dtype}")
        return arr.astype(np.int64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise ImportFormatError(f"{where}: field {name!r} is not a list of integers ({err})") from None


def need(record: Mapping[str, Any], name: str, where: str, what: str) -> Any:
    """``record[name]`` or an :class:`ImportFormatError` naming the field and the format."""
    if name not in record or record[name] is None:
        have = ", ".join(sorted(map(str, record))[:12]) if isinstance(record, Mapping) else type(record).__name__
        raise ImportFormatError(f"{where}: no field {name!r} ({what}); the record has: {have}")
    return record[name]


def same_length(where: str, n: int, **arrays: Any) -> None:
    for name, arr in arrays.items():
        if arr is not None and len(arr) != n:
            raise ImportFormatError(f"{where}: {name!r} has {len(arr)} entries but the sample has {n} tokens; "
                                    "the per-token fields of a record must be aligned with its token ids")


def safe_arm(name: str) -> str:
    """An arm name usable as a zarr group: letters, digits, ``_ . -``."""
    out = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name)).strip("_.")
    return out or "imported"


def natural_key(path: Any) -> list:
    """Sort key that orders ``step_2`` before ``step_10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


@dataclass
class SampledSequence:
    prompt: np.ndarray
    response: np.ndarray
    rollout: np.ndarray
    trainer: np.ndarray | None
    entropy: np.ndarray | None
    versions: np.ndarray | None


def split_record(rec: Record) -> list[SampledSequence]:
    """Cut a record into engine-sampled sequences: each maximal run of sampled tokens is one
    response whose prompt is every token before it (a multi-turn sample gives one sequence per
    assistant turn; tool/user tokens in between become part of the next turn's prompt)."""
    ids, sampled = rec.ids, rec.sampled.astype(bool)
    n = len(ids)
    same_length(rec.where, n, sampled=sampled, rollout=rec.rollout, trainer=rec.trainer, entropy=rec.entropy)
    version = rec.version
    if isinstance(version, np.ndarray):
        same_length(rec.where, n, policy_version=version)
    if np.any(ids < 0):
        raise ImportFormatError(f"{rec.where}: negative token id {int(ids[ids < 0][0])}: padding must be removed "
                                "(or marked by attention_mask in .npz files)")
    bad = sampled & np.isnan(rec.rollout)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ImportFormatError(
            f"{rec.where}: the rollout logprob of sampled token {i} (id {int(ids[i])}) is null/NaN "
            f"({int(bad.sum())} such token(s)): the engine returned no finite logprob there; drop this sample "
            "from the dump or fix the engine output")
    edges = np.diff(np.concatenate([[0], sampled.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    turn_versions = rec.turn_versions if rec.turn_versions and len(rec.turn_versions) == len(starts) else None
    out = []
    for j, (s, e) in enumerate(zip(starts, ends)):
        if isinstance(version, np.ndarray):
            v = version[s:e]
        elif turn_versions is not None:
            v = np.full(e - s, int(turn_versions[j]), dtype=np.int64)
        elif version is not None:
            v = np.full(e - s, int(version), dtype=np.int64)
        else:
            v = None
        out.append(SampledSequence(
            prompt=ids[:s], response=ids[s:e], rollout=rec.rollout[s:e],
            trainer=None if rec.trainer is None else rec.trainer[s:e],
            entropy=None if rec.entropy is None else rec.entropy[s:e], versions=v))
    return out


# --------------------------------------------------------------------------- building traces


@dataclass
class ArmBuilder:
    """Collects the sequences of one arm and turns them into traces, ``chunk_size`` sequences
    at a time; counts what the final attrs report."""

    arm: str
    fmt: str
    trainer_spec: TrainerSpec | None
    reading: str
    sampling: SamplingResolver
    arm_info: dict[str, Any]
    chunk_size: int
    rows: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "prompt", "response", "rollout", "trainer", "entropy", "versions", "reward", "finish", "temperature",
        "top_k", "top_p", "prompt_index", "sample_index")})
    has_trainer: bool | None = None
    has_entropy: bool | None = None
    n_records: int = 0
    n_sequences: int = 0
    n_tokens: int = 0
    n_multi_turn_records: int = 0
    n_records_without_sampled_tokens: int = 0
    n_trainer_null_tokens: int = 0
    n_not_renormalized: int = 0
    n_trainer_copies: int = 0
    dropped_trainer: bool = False
    unknown: set = field(default_factory=set)
    from_framework: set = field(default_factory=set)
    version_missing: bool = False
    reward_missing: bool = False
    finish_missing: bool = False
    files: list = field(default_factory=list)
    first_where: str = ""

    def add(self, rec: Record) -> list[xr.Dataset]:
        """Add one record; return the chunks that became full."""
        self.n_records += 1
        if not self.first_where:
            self.first_where = rec.where
        values, unknown, from_fw = self.sampling.resolve(rec.sampling, rec.where)
        self.unknown |= unknown
        self.from_framework |= from_fw
        has_trainer = rec.trainer is not None and self.reading != "none"
        self.dropped_trainer |= rec.trainer is not None and self.reading == "none"
        if self.has_trainer is None:
            self.has_trainer = has_trainer
            self.has_entropy = has_trainer and rec.entropy is not None
        elif has_trainer != self.has_trainer:
            raise ImportFormatError(
                f"{rec.where}: this record {'has' if has_trainer else 'lacks'} trainer logprobs but the first "
                f"record of arm {self.arm!r} ({self.first_where}) {'does not' if has_trainer else 'does'}: a dump "
                "must carry them for every sample or for none")
        seqs = split_record(rec)
        if not seqs:
            self.n_records_without_sampled_tokens += 1
            return []
        if len(seqs) > 1:
            self.n_multi_turn_records += 1
        if rec.version is None and rec.turn_versions is None:
            self.version_missing = True
        if rec.reward is None:
            self.reward_missing = True
        if rec.finish_reason is None:
            self.finish_missing = True
        if self.trainer_spec is not None and self.has_trainer:
            cut_k = values["top_k"] > 0 and "top_k" not in self.trainer_spec.applies
            cut_p = values["top_p"] < 1.0 and "top_p" not in self.trainer_spec.applies
            if cut_k or cut_p:
                self.n_not_renormalized += len(seqs)
        r = self.rows
        for j, s in enumerate(seqs):
            r["prompt"].append(s.prompt)
            r["response"].append(s.response)
            r["rollout"].append(s.rollout)
            if self.has_trainer:
                self.n_trainer_null_tokens += int(np.isnan(s.trainer).sum())
                self.n_trainer_copies += bool(np.array_equal(s.trainer, s.rollout))
                r["trainer"].append(s.trainer)
                if self.has_entropy:
                    r["entropy"].append(s.entropy if s.entropy is not None else np.full(len(s.response), np.nan))
            r["versions"].append(s.versions)
            r["reward"].append(np.nan if rec.reward is None else float(rec.reward))
            # an earlier turn's own stop reason is not in the dumps
            r["finish"].append(rec.finish_reason if (rec.finish_reason and j == len(seqs) - 1) else "unknown")
            for name in SAMPLING_FIELDS:
                r[name].append(values[name])
            r["prompt_index"].append(rec.prompt_index)
            r["sample_index"].append(rec.sample_index)
            self.n_sequences += 1
            self.n_tokens += len(s.response)
        if len(r["response"]) >= self.chunk_size:
            return [self.flush()]
        return []

    def flush(self) -> xr.Dataset | None:
        """The buffered sequences as one trace (``None`` when nothing is buffered)."""
        r = self.rows
        if not r["response"]:
            return None
        versions = None
        if any(v is not None for v in r["versions"]):
            versions = [v if v is not None else np.zeros(len(t), dtype=np.int64)
                        for v, t in zip(r["versions"], r["response"])]
        ds = from_rollouts(
            prompt_token_ids=r["prompt"], token_ids=r["response"], rollout_logprobs=r["rollout"],
            finish_reasons=r["finish"], policy_versions=versions, prompt_index=r["prompt_index"],
            sample_index=r["sample_index"], temperature=r["temperature"], top_k=r["top_k"], top_p=r["top_p"],
            rewards=r["reward"], attrs={"arm": self.arm, "capture_backend": f"import:{self.fmt}"})
        if self.has_trainer:
            width = ds.sizes["position"]
            arrays = {}
            readings = ["processed", "raw"] if self.reading == "both" else [self.reading]
            for reading in readings:
                lp_var, ent_var = READING_VARIABLES[reading]
                arrays[lp_var] = pad_rows(r["trainer"], np.nan, np.float64, width=width)
                if self.has_entropy:
                    arrays[ent_var] = pad_rows(r["entropy"], np.nan, np.float64, width=width)
            ds = with_trainer(ds, arrays)
        for k in r:
            r[k] = []
        try:
            return validate(ds, where=f"arm {self.arm!r} (from {self.first_where})")
        except ValueError as err:
            raise ImportFormatError(str(err)) from None

    # ------------------------------------------------------------------ final attrs

    def trainer_attrs(self) -> dict[str, Any] | None:
        if not self.has_trainer or self.trainer_spec is None:
            return None
        spec = self.trainer_spec
        reading = {"both": "processed+raw"}.get(self.reading, self.reading)
        notes = [spec.note] if spec.note else []
        if self.reading == "both":
            notes.append("temperature 1 and no top-k/top-p for the whole file: the raw and processed readings "
                         "coincide, so both variables hold the framework's values")
        if self.n_not_renormalized:
            cut = sorted({"top_k", "top_p"} - set(spec.applies))
            notes.append(f"{self.n_not_renormalized} sequence(s) were sampled with {'/'.join(cut)} cutting the "
                         f"distribution, which this framework's trainer does not apply: there its logprobs are "
                         "tempered but not renormalised over the kept set (neither reading exactly; d includes "
                         "the trainer's missing -log kept mass). `rlparity score --model` computes both exact readings")
        if self.n_trainer_copies:
            notes.append(f"on {self.n_trainer_copies} of {self.n_sequences} sequence(s) the trainer logprobs equal "
                         "the rollout's bit for bit: a copy, not a recomputation (verl's bypass mode sets "
                         "old_log_probs = rollout_log_probs); nothing to compare there")
        unknown_cuts = self.unknown & ({"top_k", "top_p"} - set(spec.applies))
        if unknown_cuts:
            notes.append(f"{'/'.join(sorted(unknown_cuts))} not known: if the run used them, this framework's "
                         "trainer did not renormalise over them; pass the values to record it")
        return {"source": f"import:{self.fmt}", "field": spec.field, "reading": reading,
                "applies": sorted(spec.applies), "decided_from": spec.source,
                "not_renormalized_sequences": self.n_not_renormalized,
                "copied_from_rollout_sequences": self.n_trainer_copies,
                "null_logprob_tokens": self.n_trainer_null_tokens, "note": " ".join(notes)}

    def final_attrs(self) -> dict[str, Any]:
        """The attrs of the finished arm (provenance, what was supplied, what is missing)."""
        missing = []
        if self.version_missing:
            missing.append("policy_version")
        if self.reward_missing:
            missing.append("reward")
        if self.finish_missing:
            missing.append("finish_reason")
        if not self.has_trainer and not self.dropped_trainer:
            missing.append("trainer_logprobs")
        missing += sorted(self.unknown)
        notes = []
        if self.version_missing:
            notes.append("policy_version is 0 where the dump records no version")
        if self.dropped_trainer:
            notes.append("the dump's trainer logprobs were dropped (trainer_reading='none')")
        if not self.has_trainer:
            notes.append("rollout side only: `rlparity score STORE --model MODEL` adds the trainer side")
        if self.n_multi_turn_records:
            notes.append(f"{self.n_multi_turn_records} record(s) held several assistant turns: one sequence "
                         "per turn, in order, sharing prompt_index/sample_index; a turn's prompt is every token before it "
                         "(finish_reason of the earlier turns: unknown)")
        imp = {
            "format": self.fmt, "file": self.files[0] if len(self.files) == 1 else self.files,
            **{k: v for k, v in self.arm_info.items() if k != "file"},
            "user_supplied": dict(self.sampling.user),
            "framework_defaults": {k: {"value": self.sampling.framework[k][0], "source": self.sampling.framework[k][1]}
                                   for k in sorted(self.from_framework)},
            "fields_missing": missing,
            "n_records": self.n_records, "n_sequences": self.n_sequences, "n_tokens": self.n_tokens,
            "n_records_without_sampled_tokens": self.n_records_without_sampled_tokens,
            "n_multi_turn_records": self.n_multi_turn_records,
            "notes": notes,
        }
        out: dict[str, Any] = {"arm": self.arm, "capture_backend": f"import:{self.fmt}", "import": imp,
                               "sampling_unknown": sorted(self.unknown, key=SAMPLING_FIELDS.index)}
        trainer = self.trainer_attrs()
        if trainer is not None:
            out["trainer"] = trainer
        return out
