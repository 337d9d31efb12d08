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
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace import arm_record, from_rollouts, pad_rows, validate, with_trainer
from rlparity.trace.schema import POSITIVE_TOLERANCE

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
    """A dump cannot be read as the named format.

    The message names the file, the line (or sample) and the field, and says how to fix it.
    """


class PickleRefusedError(ImportFormatError):
    """A ``.pt`` file needs full pickle (arbitrary code) to load: rlparity refuses it."""


class MissingSamplingError(ValueError):
    """A check needs a sampling parameter the dump did not record and nobody supplied."""


# --------------------------------------------------------------------------- sampling parameters


def check_sampling_option(name: str, value: Any) -> Any:
    """Validate a user-supplied sampling parameter.

    Parameters
    ----------
    name : {"temperature", "top_k", "top_p"}
        The parameter.
    value : float, int or None
        The value given; ``None`` means not given.

    Returns
    -------
    float, int or None
        The value normalised: temperature >= 0, top_k >= 0 (-1, vLLM's "off", is stored as 0,
        the schema's "off"), top_p in (0, 1]; ``None`` when not given.

    Raises
    ------
    ValueError
        If the value is a boolean or out of range, or top_k is not whole.
    KeyError
        If ``name`` is not a sampling parameter.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: give a number")
    if name == "temperature":
        v = float(value)
        if not 0.0 <= v < math.inf:
            raise ValueError(f"temperature={value!r}: give the sampling temperature, >= 0 (e.g. {OPTION_FLAG[name]})")
        return v
    if name == "top_k":
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise ValueError(f"top_k={value!r}: give an integer (0 or -1 = off)")
        v = int(value)
        if not -1 <= v <= 2**31 - 1:
            raise ValueError(f"top_k={value!r}: give 0 (off) or a positive integer (at most 2**31 - 1)")
        return max(v, 0)
    if name == "top_p":
        v = float(value)
        if not 0.0 < v <= 1.0:
            raise ValueError(f"top_p={value!r}: give a value in (0, 1] (1 = off)")
        return v
    raise KeyError(name)


def dump_sampling_value(name: str, value: Any, where: str) -> Any:
    """A sampling parameter read from a dump, normalised (``None`` = the dump does not say).

    Parameters
    ----------
    name : {"temperature", "top_k", "top_p"}
        The parameter.
    value : object
        The dump's value; ``None`` and NaN mean not recorded; top_k -1 means off (0).
    where : str
        Where the value comes from (file and line or sample), for the error message.

    Returns
    -------
    float, int or None
        The value as :func:`check_sampling_option` normalises it.

    Raises
    ------
    ImportFormatError
        If the value is not a valid sampling parameter.
    """
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
    """Per-sequence sampling parameters: the dump's, else the user's, else the framework's default, else unknown.

    Unknown values are recorded, never guessed. A user option that contradicts the dump is an
    error: the dump says what ran.

    Parameters
    ----------
    user : dict
        The user's options (``temperature``, ``top_k``, ``top_p``; ``None`` = not given),
        validated by :func:`check_sampling_option`.
    framework : dict, optional
        The framework's documented defaults: ``{field: (value, source)}``.
    """

    user: dict[str, Any]
    framework: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.user = {k: check_sampling_option(k, v) for k, v in self.user.items() if v is not None}

    def uniform(self, file_values: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The values every sequence of a file shares.

        Parameters
        ----------
        file_values : Mapping, optional
            File-level values the dump records (``None`` entries ignored).

        Returns
        -------
        dict
            Framework defaults, overridden by the file's values, overridden by the user's options; a
            field missing here varies per record or is unknown.
        """
        out = {k: v for k, (v, _) in self.framework.items()}
        out.update({k: v for k, v in (file_values or {}).items() if v is not None})
        out.update(self.user)
        return out

    def resolve(self, dump: Mapping[str, Any], where: str) -> tuple[dict[str, Any], set[str], set[str]]:
        """The sampling parameters of one record.

        Parameters
        ----------
        dump : Mapping
            The record's own values (``temperature``, ``top_k``, ``top_p``; missing = not recorded).
        where : str
            Where the value comes from (file and line or sample), for the error message.

        Returns
        -------
        tuple of (dict, set of str, set of str)
            ``(values, unknown fields, fields taken from the framework default)``; an unknown field's
            value is NaN (temperature, top_p) or -1 (top_k).

        Raises
        ------
        ImportFormatError
            If a dump value is invalid or contradicts the user's option.
        """
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
    """The sampling parameters an imported trace does not know.

    The dump lacked them and no option gave them: stored as NaN (temperature, top_p) and -1
    (top_k) and listed in ``attrs["sampling_unknown"]``.

    Parameters
    ----------
    trace : xarray.Dataset
        An imported trace.

    Returns
    -------
    list of str
        The unknown fields, in the order ``temperature``, ``top_k``, ``top_p``.
    """
    listed = list(arm_record(trace).sampling_unknown or [])
    found = set(listed)
    if "temperature" in trace and np.isnan(trace["temperature"].values).any():
        found.add("temperature")
    if "top_p" in trace and np.isnan(trace["top_p"].values).any():
        found.add("top_p")
    return [f for f in SAMPLING_FIELDS if f in found]


def require_sampling(trace: xr.Dataset, fields: Sequence[str] = SAMPLING_FIELDS, *, needed_for: str = "this check"
                     ) -> None:
    """Raise :class:`MissingSamplingError` for each field the trace does not know, saying how to supply it.

    Parameters
    ----------
    trace : xarray.Dataset
        An imported trace.
    fields : sequence of str, default SAMPLING_FIELDS
        The fields the check needs.
    needed_for : str, default "this check"
        What needs them, for the message.

    Raises
    ------
    MissingSamplingError
        If any of ``fields`` is unknown; the message names the import option with an example value.
    """
    missing = [f for f in sampling_unknown(trace) if f in fields]
    if not missing:
        return
    imp = arm_record(trace).import_ or {}
    src, fmt = imp.get("file") or "the dump", imp.get("format") or "FORMAT"
    flags = " ".join(OPTION_FLAG[f] for f in missing)
    kwargs = ", ".join(OPTION_KWARG[f] for f in missing)
    raise MissingSamplingError(
        f"{needed_for} needs {', '.join(missing)}, which {src} does not record: re-import with the values "
        f"your run used, e.g. `rlparity import {fmt} PATH -o STORE {flags}` "
        f"(rlparity.importers.read({fmt!r}, path, {kwargs}))")


# --------------------------------------------------------------------------- trainer reading


@dataclass(frozen=True)
class TrainerSpec:
    """How a framework computes the trainer logprobs it dumps.

    Parameters
    ----------
    field : str
        The dump's field that holds them.
    applies : frozenset of str
        The sampler steps its trainer applies to the logits before the log-softmax
        (``temperature``, ``top_k``, ``top_p``, renormalised).
    source : str
        The public file read to decide it.
    note : str, default ""
        A remark recorded in the trainer attrs.
    """

    field: str
    applies: frozenset[str]
    source: str
    note: str = ""


def decide_reading(spec: TrainerSpec, uniform: Mapping[str, Any], override: str | None) -> str:
    """Which schema reading the framework's trainer logprobs are.

    A trainer that applies the sampling temperature computes the processed reading whenever the
    sampler cut nothing it does not cut itself; sequences where it does not are counted and noted
    (see :meth:`ArmBuilder.trainer_attrs`).

    Parameters
    ----------
    spec : TrainerSpec
        How the framework's trainer computes them.
    uniform : Mapping
        The sampling values every sequence of the file shares (:meth:`SamplingResolver.uniform`).
    override : str or None
        The user's ``trainer_reading``; ``None``: decided here.

    Returns
    -------
    str
        ``"processed"``, ``"raw"``, ``"both"`` (temperature 1 and no top-k/top-p, known for the
        whole file: the two coincide) or ``"none"`` (the user dropped them).

    Raises
    ------
    ValueError
        If ``override`` is not one of ``processed``, ``raw``, ``none``.
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


# --------------------------------------------------------------------------- per-record values


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "a boolean"
    if isinstance(value, (int, float, np.number)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim):
        return "a list"
    return f"a {type(value).__name__}"


def _plain(value: Any) -> Any:
    """A 0-d array, numpy scalar or one-element tensor as a Python value."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "detach") and getattr(value, "ndim", 1) == 0:  # a 0-d torch tensor
        return value.item()
    return value


def as_int(value: Any, where: str, name: str, *, lo: int = 0, hi: int = 2**53) -> int | None:
    """One whole number of a record (``None`` stays ``None``).

    Parameters
    ----------
    value : object
        The value (a 0-d array, numpy scalar or 0-d tensor is read as its Python value).
    where : str
        Where the value comes from (file and line or sample), for the error message.
    name : str
        The field's name, for the message.
    lo : int, default 0
        The smallest value allowed.
    hi : int, default 2**53
        The largest value allowed.

    Returns
    -------
    int or None
        The value.

    Raises
    ------
    ImportFormatError
        If the value is a list, an object, a string, a boolean, a fraction, NaN or outside
        ``[lo, hi]``; the message names ``where`` and the field.
    """
    value = _plain(value)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ImportFormatError(f"{where}: field {name!r} is {_kind(value)} ({_short(value)}), not a whole number: "
                                f"write one integer in [{lo}, {hi}]")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ImportFormatError(f"{where}: field {name!r} = {_short(value)} is not a whole number: "
                                f"write one integer in [{lo}, {hi}]")
    if not lo <= value <= hi:
        raise ImportFormatError(f"{where}: field {name!r} = {_short(value)} is out of range: "
                                f"write one integer in [{lo}, {hi}]")
    return int(value)


#: a number of a record beyond this is not what the field holds (a mis-parsed field, an overflow)
NUMBER_LIMIT = 1e30


def as_number(value: Any, where: str, name: str, fix: str) -> float | None:
    """One real number of a record (``None`` and NaN = not recorded).

    Parameters
    ----------
    value : object
        The value (a 0-d array, numpy scalar or 0-d tensor is read as its Python value).
    where : str
        Where the value comes from (file and line or sample), for the error message.
    name : str
        The field's name, for the message.
    fix : str
        How to fix a bad value, the message's end.

    Returns
    -------
    float or None
        The value; ``None`` for ``None`` or NaN.

    Raises
    ------
    ImportFormatError
        If the value is a list, an object, a string, a boolean, an infinity or above
        :data:`NUMBER_LIMIT` (1e30) in magnitude.
    """
    value = _plain(value)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ImportFormatError(f"{where}: field {name!r} is {_kind(value)} ({_short(value)}), not a number: {fix}")
    value = float(value)
    if math.isnan(value):
        return None
    if not abs(value) <= NUMBER_LIMIT:
        raise ImportFormatError(f"{where}: field {name!r} = {_short(value)} is out of range (|value| must be "
                                f"finite and at most {NUMBER_LIMIT:g}): {fix}")
    return value


def as_reward(value: Any, where: str, name: str = "reward") -> float | None:
    """One sequence reward (``None`` and NaN = not scored): see :func:`as_number`.

    Parameters
    ----------
    value : object
        The reward.
    where : str
        Where the value comes from (file and line or sample), for the error message.
    name : str, default "reward"
        The field's name, for the message.

    Returns
    -------
    float or None
        The reward; ``None`` when not scored.

    Raises
    ------
    ImportFormatError
        If the value is not one finite number.
    """
    return as_number(value, where, name, "write one reward per sequence (null when it was not scored)")


def _sequence(values: Any, where: str, name: str, what: str) -> Any:
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().to("cpu")
        values = values.double().numpy() if what == "numbers" and values.is_floating_point() else values.numpy()
    if isinstance(values, (list, tuple)):
        return values
    if not isinstance(values, np.ndarray) or values.ndim == 0:
        raise ImportFormatError(f"{where}: field {name!r} is {_kind(values)} ({_short(values)}), not a list of {what}")
    if isinstance(values, np.ndarray) and values.dtype.kind not in "biuf":
        raise ImportFormatError(f"{where}: field {name!r} holds values of type {values.dtype}, not {what}")
    return values


def _element_types(values: Any, where: str, name: str, allowed: tuple, what: str) -> set:
    """The element types of a list (empty for arrays); refuse anything but ``allowed`` (JSON
    true/false, strings, objects): numpy would turn ``true`` into 1 and ``"0.5"`` into 0.5, and
    ``None`` into NaN, without a word."""
    if not isinstance(values, (list, tuple)):
        return set()
    kinds = set(map(type, values))
    if kinds <= set(allowed):
        return kinds
    i, v = next((i, v) for i, v in enumerate(values) if type(v) not in allowed)
    raise ImportFormatError(f"{where}: field {name!r} holds {_kind(v)} ({_short(v)}) at position {i}, not one of "
                            f"the {what} it should hold: write one value per token")


def floats(values: Any, where: str, name: str, *, null: float = math.nan) -> np.ndarray:
    """A 1-d float64 array from a flat list of numbers.

    Parameters
    ----------
    values : list, numpy.ndarray or torch.Tensor
        The numbers.
    where : str
        Where the value comes from (file and line or sample), for the error message.
    name : str
        The field's name, for the message.
    null : float, default nan
        What a JSON ``null`` / ``None`` becomes (NaN unless the format says what its nulls stand for).

    Returns
    -------
    numpy.ndarray
        Float64, one value per entry.

    Raises
    ------
    ImportFormatError
        If the values hold booleans, strings or nested lists; the message names the field.
    """
    values = _sequence(values, where, name, "numbers")
    kinds = _element_types(values, where, name, (float, int, type(None)), "numbers")
    if type(None) in kinds:
        values = [null if v is None else v for v in values]
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ImportFormatError(f"{where}: field {name!r} is not a list of numbers ({err})") from None
    if arr.ndim != 1:
        raise ImportFormatError(f"{where}: field {name!r} has shape {arr.shape}: write a flat list, one number per token")
    return arr


INT64_MAX = 2**63 - 1


def ints(values: Any, where: str, name: str, *, mask: bool = False) -> np.ndarray:
    """A 1-d int64 array (token ids, or a 0/1 mask) from a flat list of whole numbers.

    Parameters
    ----------
    values : list, numpy.ndarray or torch.Tensor
        The numbers.
    where : str
        Where the value comes from (file and line or sample), for the error message.
    name : str
        The field's name, for the message.
    mask : bool, default False
        Accept ``true`` / ``false`` too (a mask).

    Returns
    -------
    numpy.ndarray
        Int64, one value per entry.

    Raises
    ------
    ImportFormatError
        If a value is above 2**63 - 1, a fraction, NaN, a float above 2**53, a string or a nested
        list; the message names the field and the position.
    """
    values = _sequence(values, where, name, "integers")
    kinds = _element_types(values, where, name, (int, float, bool) if mask else (int, float), "integers")
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as err:
        raise ImportFormatError(f"{where}: field {name!r} is not a list of integers ({err})") from None
    if arr.ndim != 1:
        raise ImportFormatError(f"{where}: field {name!r} has shape {arr.shape}: write a flat list, one integer per token")
    if arr.dtype == bool:
        return arr.astype(np.int64)
    # Python ints beyond int64 make numpy choose uint64, float64 or object: find them by value
    if (arr.dtype.kind == "u" and arr.size and int(arr.max()) > INT64_MAX or arr.dtype.kind == "O"
            or arr.dtype.kind == "f" and float not in kinds and kinds):
        for i, v in enumerate(values if isinstance(values, (list, tuple)) else arr.tolist()):
            if isinstance(v, int) and not isinstance(v, bool) and not -INT64_MAX - 1 <= v <= INT64_MAX:
                raise ImportFormatError(f"{where}: field {name!r} holds {v} at position {i}, too large for a token id "
                                        "or mask (beyond 64-bit integers): the values are not token ids")
    if arr.dtype.kind == "O":
        raise ImportFormatError(f"{where}: field {name!r} holds values numpy cannot read as integers")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "NaN" if np.isnan(arr[i]) else _short(float(arr[i]))
            raise ImportFormatError(f"{where}: field {name!r} holds {what} at position {i} ({int(bad.sum())} such "
                                    "value(s)), not a whole number: store integer ids (NaN cannot mark padding: "
                                    "use an attention_mask or -1)")
        if np.abs(arr).max(initial=0) > 2**53:
            raise ImportFormatError(f"{where}: field {name!r} holds floats above 2**53, where floats are not exact: "
                                    "store integer ids")
    elif arr.dtype.kind not in "iu":
        raise ImportFormatError(f"{where}: field {name!r} holds values of type {arr.dtype}, not integers")
    return arr.astype(np.int64)


def need(record: Mapping[str, Any], name: str, where: str, what: str) -> Any:
    """``record[name]``, or an error naming the field and the fields the record has.

    Parameters
    ----------
    record : Mapping
        One record of the dump.
    name : str
        The field.
    where : str
        Where the value comes from (file and line or sample), for the error message.
    what : str
        What the field holds, for the message.

    Returns
    -------
    object
        ``record[name]``.

    Raises
    ------
    ImportFormatError
        If the field is missing or ``None``.
    """
    if name not in record or record[name] is None:
        have = ", ".join(sorted(map(str, record))[:12]) if isinstance(record, Mapping) else type(record).__name__
        raise ImportFormatError(f"{where}: no field {name!r} ({what}); the record has: {have}")
    return record[name]


def same_length(where: str, n: int, **arrays: Any) -> None:
    r"""Check that a record's per-token arrays are aligned with its token ids.

    Parameters
    ----------
    where : str
        Where the value comes from (file and line or sample), for the error message.
    n : int
        The record's number of tokens.
    \*\*arrays
        The arrays by field name (``None`` = absent, not checked).

    Raises
    ------
    ImportFormatError
        If an array's length is not ``n``.
    """
    for name, arr in arrays.items():
        if arr is not None and len(arr) != n:
            raise ImportFormatError(f"{where}: {name!r} has {len(arr)} entries but the sample has {n} tokens; "
                                    "the per-token fields of a record must be aligned with its token ids")


def safe_arm(name: str) -> str:
    """An arm name usable as a zarr group: letters, digits, ``_ . -``.

    Parameters
    ----------
    name : str
        The name.

    Returns
    -------
    str
        Every run of other characters replaced by ``_``, leading and trailing ``_`` and ``.``
        stripped; ``"imported"`` when nothing is left.
    """
    out = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name)).strip("_.")
    return out or "imported"


def natural_key(path: Any) -> list:
    """Sort key that orders ``step_2`` before ``step_10``.

    Parameters
    ----------
    path : object
        A path or name (its ``str``).

    Returns
    -------
    list
        The text split into runs of digits (as ints) and the rest.
    """
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ArmKey:
    """What makes an arm: one arm per (run, launch, split, step) of a dump, plus a format's own distinction.

    These are stored as the arm's coordinates (``attrs["import"]["coords"]``); the arm name is only
    a label built from them.

    Parameters
    ----------
    label : str
        How the format names the step (``step_3``, ``rollout_2``; a file name when the dump has no step).
    step : int, optional
        The dump's step; ``None``: the dump has none.
    run : str, optional
        The run's name, where the dump has several.
    split : str, default "train"
        The split (``train``, ``validation``...).
    kind : str, default ""
        A format's own distinction (slime's rollout vs train dump).
    launch : str, default ""
        Filled by the reader from the folder a file came from.
    """

    label: str
    step: int | None = None
    run: str | None = None
    split: str = "train"
    kind: str = ""
    launch: str = ""

    def name(self) -> str:
        """The arm's name: launch, run, label and kind joined by ``_`` (a run named like its launch folder said once).

        Returns
        -------
        str
            A name usable as a zarr group (:func:`safe_arm`).
        """
        launch = "" if self.launch == "." else self.launch
        # prime-rl's multi-run layout puts a run in a folder named after it: say it once
        run = None if self.run and Path(launch).name == self.run else self.run
        return safe_arm("_".join(p for p in (launch, run, self.label, self.kind) if p))

    def coords(self) -> dict[str, Any]:
        """The arm's coordinates, as stored in ``attrs["import"]["coords"]``.

        Returns
        -------
        dict
            ``run``, ``launch``, ``split``, ``step`` and, when set, ``kind``.
        """
        return {"run": self.run, "launch": self.launch, "split": self.split, "step": self.step,
                **({"kind": self.kind} if self.kind else {})}


#: what a record's per-token arrays are called in the dump (for messages)
FIELD_NAMES = {"rollout": "rollout logprob", "trainer": "trainer logprob", "entropy": "trainer entropy"}


@dataclass
class Record:
    """One sample of a dump, before it is cut into engine-sampled sequences.

    Parameters
    ----------
    key : ArmKey
        The arm the sample belongs to.
    where : str
        The file and line (or sample), for messages.
    ids : numpy.ndarray
        Token ids: the prompt and every later token.
    sampled : numpy.ndarray
        Aligned with ``ids``: marks the tokens the engine sampled and the framework trains with RL.
    rollout : numpy.ndarray
        Aligned with ``ids``: the engine's logprob (nats) at sampled tokens (NaN = the dump's null).
    trainer : numpy.ndarray, optional
        Aligned with ``ids``: the framework's trainer logprob (nats; ``-inf`` = probability 0).
    entropy : numpy.ndarray, optional
        Aligned with ``ids``: the trainer's entropy (nats).
    version : int or numpy.ndarray, optional
        One policy version for the sample, one per token, or ``None`` (not recorded).
    turn_versions : list of int, optional
        One policy version per assistant turn.
    reward : float, optional
        The sample's reward; ``None``: not scored.
    finish_reason : str, optional
        Why sampling stopped; ``None``: not recorded.
    sampling : dict, optional
        The sampling parameters the dump records for the sample.
    prompt_index : int or str, optional
        The prompt's index (an int) or a group name the dump gives; ``None``: grouped by
        identical prompt ids.
    sample_index : int, optional
        The sample's index within its prompt; ``None``: numbered in order of appearance.
    prompt_text : str, optional
        The prompt's text, when the dump has it.
    prompt_messages : str, optional
        The prompt's chat messages as JSON, when the dump has them.
    excluded : dict, optional
        Tokens the framework marks as not RL-sampled (a loss or sample mask), counted per
        ``(code, reason)``: they are left out of ``sampled``.
    names : Mapping of str to str, optional
        Maps ``rollout`` / ``trainer`` / ``entropy`` to the dump's field names (for messages).
    note : str, optional
        Something about this record that the arm's notes list once (with a count).
    arm_info : dict, optional
        Per-arm facts (ranks, dump versions) whose distinct values the arm's attrs list.
    """

    key: ArmKey
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
    prompt_index: int | str | None = None
    sample_index: int | None = None
    prompt_text: str | None = None
    prompt_messages: str | None = None
    excluded: dict[tuple[str, str], int] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=lambda: FIELD_NAMES)
    note: str | None = None
    arm_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class SampledSequence:
    """One engine-sampled sequence cut from a :class:`Record` (:func:`split_record`).

    Parameters
    ----------
    prompt : numpy.ndarray
        Every token before the response.
    response : numpy.ndarray
        The sampled tokens.
    rollout : numpy.ndarray
        The engine's logprob of each response token, nats.
    trainer : numpy.ndarray or None
        The framework's trainer logprob of each response token, nats.
    entropy : numpy.ndarray or None
        The trainer's entropy at each response token, nats.
    versions : numpy.ndarray or None
        The policy version of each response token; ``None``: not recorded.
    """
    prompt: np.ndarray
    response: np.ndarray
    rollout: np.ndarray
    trainer: np.ndarray | None
    entropy: np.ndarray | None
    versions: np.ndarray | None


def _refuse_values(rec: Record, name: str, bad: np.ndarray, what: str, fix: str) -> None:
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    k = int(np.count_nonzero(rec.sampled[: i + 1]))
    raise ImportFormatError(f"{rec.where}: {rec.names.get(name, name)} is {what} at token {i} (id {int(rec.ids[i])}, "
                            f"sampled token {k} of the sample; {int(bad.sum())} such token(s)): {fix}")


_NOT_LOGPROB = "store the log-softmax of the sampled token in nats (<= 0)"
_NO_TRAINER = "import without the trainer side (trainer_reading='none') and `rlparity score` it"


def check_values(rec: Record) -> int:
    """Refuse what a sampled token cannot carry, naming the record's file and line.

    Refused: a rollout logprob that is null/NaN, infinite or positive; a trainer logprob that is
    NaN, +inf or positive; a non-finite trainer entropy.

    Parameters
    ----------
    rec : Record
        The record.

    Returns
    -------
    int
        The number of sampled tokens whose trainer logprob is ``-inf`` (probability 0: legal, counted).

    Raises
    ------
    ImportFormatError
        At the first refused value (its token, id and how many such tokens).
    """
    s = rec.sampled.astype(bool)
    r, t, e = rec.rollout, rec.trainer, rec.entropy
    with np.errstate(invalid="ignore"):
        checks = [
            ("rollout", np.isnan(r), "null/NaN", "the engine returned no finite logprob there; drop this sample from "
                                                 "the dump or fix the engine output"),
            ("rollout", np.isinf(r), "infinite", "an engine cannot give probability 0 (or > 1) to a token it sampled "
                                                 "itself: check its logprobs_mode and what the dump stores there"),
            ("rollout", r > POSITIVE_TOLERANCE, "positive (not a log-probability)", _NOT_LOGPROB)]
        if t is not None:
            checks += [("trainer", np.isnan(t), "NaN", "a missing value (null or NaN), not a token of probability 0 (write "
                        f"-Infinity for that): the trainer's forward pass produced NaN there or the dump left it out; "
                        f"re-run the trainer step or {_NO_TRAINER}"),
                       ("trainer", t > POSITIVE_TOLERANCE, "positive or +inf (not a log-probability)", _NOT_LOGPROB)]
        if e is not None:
            checks.append(("entropy", ~np.isfinite(e), "null/non-finite",
                           f"the trainer's forward pass produced no finite entropy there; {_NO_TRAINER}"))
        for name, bad, what, fix in checks:
            _refuse_values(rec, name, s & bad, what, fix)
        return 0 if t is None else int((s & (t == -np.inf)).sum())


def split_record(rec: Record) -> list[SampledSequence]:
    """Cut a record into engine-sampled sequences.

    Each maximal run of sampled tokens is one response whose prompt is every token before it (a
    multi-turn sample gives one sequence per assistant turn; tool/user tokens in between become
    part of the next turn's prompt).

    Parameters
    ----------
    rec : Record
        The record.

    Returns
    -------
    list of SampledSequence
        One per run of sampled tokens, in order (empty when nothing was sampled).

    Raises
    ------
    ImportFormatError
        If the per-token arrays are not aligned with the ids, or an id is negative (padding).
    """
    ids, sampled = rec.ids, rec.sampled.astype(bool)
    n = len(ids)
    same_length(rec.where, n, sampled=sampled, rollout=rec.rollout, trainer=rec.trainer, entropy=rec.entropy)
    version = rec.version
    if isinstance(version, np.ndarray):
        same_length(rec.where, n, policy_version=version)
    if np.any(ids < 0):
        raise ImportFormatError(f"{rec.where}: negative token id {int(ids[ids < 0][0])}: padding must be removed "
                                "(or marked by attention_mask in .npz files)")
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


def _distinct(info: dict[str, list], new: Mapping[str, Any]) -> None:
    """Collect the distinct values of each per-arm fact (ranks, dump versions) in order."""
    for k, v in new.items():
        seen = info.setdefault(k, [])
        if v not in seen:
            seen.append(v)


@dataclass
class ArmBuilder:
    """Collects the sequences of one arm and turns them into traces, ``chunk_size`` sequences at a time.

    It also counts what the final attrs report. Only the first eight fields are given; the rest
    is its running state.

    Parameters
    ----------
    arm : str
        The arm's name.
    key : ArmKey
        The arm's coordinates.
    fmt : str
        The format's name.
    trainer_spec : TrainerSpec or None
        How the framework's trainer computes its logprobs; ``None``: the dump has none.
    reading : str
        Where the trainer logprobs go (:func:`decide_reading`).
    sampling : SamplingResolver
        Resolves each record's sampling parameters.
    chunk_size : int
        Sequences per trace chunk.
    prompt_tokenization : dict, optional
        How the framework tokenizes prompt texts (recorded when texts are kept).
    rows : dict of str to list, optional
        The buffered per-sequence values of the chunk being built.
    info : dict of str to list, optional
        Per-arm facts and their distinct values.
    groups : dict, optional
        Prompt group -> ``[prompt_index, samples so far]``.
    has_trainer : bool, optional
        Whether the arm carries trainer logprobs (set by the first record).
    has_entropy : bool, optional
        Whether the arm carries trainer entropies (set by the first record).
    n_records : int, default 0
        Records added.
    n_sequences : int, default 0
        Sequences built.
    n_tokens : int, default 0
        Response tokens built.
    n_multi_turn_records : int, default 0
        Records that gave more than one sequence.
    n_records_without_sampled_tokens : int, default 0
        Records that gave none.
    n_trainer_zero_prob_tokens : int, default 0
        Sampled tokens with trainer logprob ``-inf``.
    n_not_renormalized : int, default 0
        Sequences sampled with a top-k/top-p cut the framework's trainer does not apply.
    n_trainer_copies : int, default 0
        Sequences whose trainer logprobs equal the rollout's bit for bit.
    n_prompt_texts : int, default 0
        Records with a prompt text or messages.
    excluded : dict, optional
        Per exclusion code: tokens, records, records left empty, reason.
    record_notes : dict of str to int, optional
        Record notes and their counts.
    dropped_trainer : bool, default False
        Whether trainer logprobs were dropped (``trainer_reading='none'``).
    unknown : set, optional
        Sampling fields unknown for some sequence.
    from_framework : set, optional
        Sampling fields taken from the framework's default.
    version_missing : bool, default False
        Whether some record has no policy version.
    reward_missing : bool, default False
        Whether some record has no reward.
    finish_missing : bool, default False
        Whether some record has no finish reason.
    grouped_by_prompt : bool, default False
        Whether prompts were grouped by identical prompt ids.
    files : list, optional
        The files the arm was read from.
    first_where : str, default ""
        Where the arm's first record came from (for messages).
    """

    arm: str
    key: ArmKey
    fmt: str
    trainer_spec: TrainerSpec | None
    reading: str
    sampling: SamplingResolver
    chunk_size: int
    prompt_tokenization: dict[str, Any] | None = None
    rows: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "prompt", "response", "rollout", "trainer", "entropy", "versions", "reward", "finish", "temperature",
        "top_k", "top_p", "prompt_index", "sample_index", "prompt_text", "prompt_messages")})
    info: dict[str, list] = field(default_factory=dict)  # fact -> its distinct values
    groups: dict[Any, list[int]] = field(default_factory=dict)  # group -> [prompt_index, samples so far]
    has_trainer: bool | None = None
    has_entropy: bool | None = None
    n_records: int = 0
    n_sequences: int = 0
    n_tokens: int = 0
    n_multi_turn_records: int = 0
    n_records_without_sampled_tokens: int = 0
    n_trainer_zero_prob_tokens: int = 0
    n_not_renormalized: int = 0
    n_trainer_copies: int = 0
    n_prompt_texts: int = 0
    excluded: dict[str, dict[str, Any]] = field(default_factory=dict)  # code -> counts and reason
    record_notes: dict[str, int] = field(default_factory=dict)
    dropped_trainer: bool = False
    unknown: set = field(default_factory=set)
    from_framework: set = field(default_factory=set)
    version_missing: bool = False
    reward_missing: bool = False
    finish_missing: bool = False
    grouped_by_prompt: bool = False
    files: list = field(default_factory=list)
    first_where: str = ""

    def _group(self, rec: Record, seqs: list[SampledSequence]) -> tuple[int, int]:
        """``(prompt_index, sample_index)``: the record's own index; else its group (a name the
        dump gives, or identical prompt ids: the tokens before its first sampled token) numbered
        in order of appearance."""
        if isinstance(rec.prompt_index, int):
            return rec.prompt_index, (rec.sample_index if rec.sample_index is not None else 0)
        if rec.prompt_index is None:
            self.grouped_by_prompt = True
            key: Any = np.ascontiguousarray(seqs[0].prompt, dtype=np.int64).tobytes()
        else:
            key = rec.prompt_index
        g = self.groups.setdefault(key, [len(self.groups), 0])
        g[1] += 1
        return g[0], (rec.sample_index if rec.sample_index is not None else g[1] - 1)

    def _count_excluded(self, rec: Record, kept_any: bool) -> None:
        for (code, reason), n in rec.excluded.items():
            if n:
                e = self.excluded.setdefault(code, {"tokens": 0, "records": 0, "records_left_empty": 0,
                                                    "reason": reason})
                e["tokens"] += int(n)
                e["records"] += 1
                e["records_left_empty"] += int(not kept_any)

    def add(self, rec: Record) -> list[xr.Dataset]:
        """Add one record; return the chunks that became full.

        Parameters
        ----------
        rec : Record
            The record (its trainer and entropy arrays may be dropped in place to match the arm).

        Returns
        -------
        list of xarray.Dataset
            The full chunk (at most one), or nothing.

        Raises
        ------
        ImportFormatError
            If the record's values are refused (:func:`check_values`), its sampling contradicts an
            option, or it carries trainer logprobs (or entropies) where the arm's first record did
            not, or the other way round.
        """
        self.n_records += 1
        if not self.first_where:
            self.first_where = rec.where
        _distinct(self.info, rec.arm_info)
        if rec.note:
            self.record_notes[rec.note] = self.record_notes.get(rec.note, 0) + 1
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
        if not has_trainer:
            rec.trainer = rec.entropy = None
        elif not self.has_entropy:
            rec.entropy = None
        elif rec.entropy is None:
            raise ImportFormatError(f"{rec.where}: this record has no {rec.names.get('entropy', 'entropy')} but the "
                                    f"first record of arm {self.arm!r} ({self.first_where}) does: a dump must carry it "
                                    "for every sample or for none")
        zero_prob = check_values(rec)
        seqs = split_record(rec)
        self._count_excluded(rec, bool(seqs))
        if not seqs:
            self.n_records_without_sampled_tokens += 1
            return []
        self.n_trainer_zero_prob_tokens += zero_prob
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
        prompt_index, sample_index = self._group(rec, seqs)
        self.n_prompt_texts += bool(rec.prompt_text or rec.prompt_messages)
        r = self.rows
        for j, s in enumerate(seqs):
            r["prompt"].append(s.prompt)
            r["response"].append(s.response)
            r["rollout"].append(s.rollout)
            if self.has_trainer:
                self.n_trainer_copies += bool(np.array_equal(s.trainer, s.rollout))
                r["trainer"].append(s.trainer)
                if self.has_entropy:
                    r["entropy"].append(s.entropy)
            r["versions"].append(s.versions)
            r["reward"].append(np.nan if rec.reward is None else float(rec.reward))
            # an earlier turn's own stop reason is not in the dumps
            r["finish"].append(rec.finish_reason if (rec.finish_reason and j == len(seqs) - 1) else "unknown")
            for name in SAMPLING_FIELDS:
                r[name].append(values[name])
            r["prompt_index"].append(prompt_index)
            r["sample_index"].append(sample_index)
            # the prompt text is the first turn's prompt; a later turn's prompt holds earlier turns too
            r["prompt_text"].append((rec.prompt_text or "") if j == 0 else "")
            r["prompt_messages"].append((rec.prompt_messages or "") if j == 0 else "")
            self.n_sequences += 1
            self.n_tokens += len(s.response)
        if len(r["response"]) >= self.chunk_size:
            return [self.flush()]
        return []

    def flush(self) -> xr.Dataset | None:
        """The buffered sequences as one trace, then clear the buffer.

        Returns
        -------
        xarray.Dataset or None
            A validated trace (:func:`rlparity.trace.from_rollouts`, plus the trainer side via
            :func:`rlparity.trace.with_trainer`); ``None`` when nothing is buffered.

        Raises
        ------
        ImportFormatError
            If the trace fails validation.
        """
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
            rewards=r["reward"], prompt_texts=r["prompt_text"], prompt_messages=r["prompt_messages"],
            attrs={"arm": self.arm, "capture_backend": f"import:{self.fmt}"})
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
        """The ``attrs["trainer"]`` of the arm: the reading, what the framework's trainer applies and the notes.

        Returns
        -------
        dict or None
            ``source``, ``field``, ``reading``, ``applies``, ``decided_from``,
            ``not_renormalized_sequences``, ``copied_from_rollout_sequences``,
            ``zero_probability_tokens`` and ``note``; ``None`` when the arm has no trainer side.
        """
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
        if self.n_trainer_zero_prob_tokens:
            notes.append(f"{self.n_trainer_zero_prob_tokens} sampled token(s) have trainer logprob -inf (probability "
                         "0 for the trainer)")
        unknown_cuts = self.unknown & ({"top_k", "top_p"} - set(spec.applies))
        if unknown_cuts:
            notes.append(f"{'/'.join(sorted(unknown_cuts))} not known: if the run used them, this framework's "
                         "trainer did not renormalise over them; pass the values to record it")
        return {"source": f"import:{self.fmt}", "field": spec.field, "reading": reading,
                "applies": sorted(spec.applies), "decided_from": spec.source,
                "not_renormalized_sequences": self.n_not_renormalized,
                "copied_from_rollout_sequences": self.n_trainer_copies,
                "zero_probability_tokens": self.n_trainer_zero_prob_tokens, "note": " ".join(notes)}

    def final_attrs(self) -> dict[str, Any]:
        """The attrs of the finished arm (provenance, coordinates, what was supplied, excluded, missing).

        Returns
        -------
        dict
            ``arm``, ``capture_backend``, ``import`` (format, files, coordinates, user-supplied and
            framework-default sampling, missing fields, counts, exclusions, notes),
            ``sampling_unknown`` and, with a trainer side, ``trainer``.
        """
        missing = []
        if self.version_missing:
            missing.append("policy_version")
        if self.reward_missing:
            missing.append("reward")
        if self.finish_missing:
            missing.append("finish_reason")
        if not self.has_trainer and not self.dropped_trainer:
            missing.append("trainer_logprobs")
        if not self.n_prompt_texts:
            missing.append("prompt_text")
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
                         "(finish_reason of the earlier turns: unknown; prompt_text only on the first turn)")
        if self.grouped_by_prompt:
            notes.append(f"prompt_index groups samples with identical prompt token ids ({len(self.groups)} prompts; "
                         "the dump records no group)")
        notes += [f"{k} record(s): {note}" for note, k in self.record_notes.items()]
        for e in self.excluded.values():
            notes.append(f"excluded {e['tokens']} token(s) of {e['records']} sample(s) ({e['records_left_empty']} left "
                         f"with none): {e['reason']}")
        if self.n_prompt_texts and self.prompt_tokenization:
            notes.append(f"prompt text of {self.n_prompt_texts} sample(s) kept: `rlparity score STORE --model MODEL` "
                         "tokenizes it as the framework does and checks the engine's prompt ids against it")
        info = {k: v[0] if len(v) == 1 else v for k, v in self.info.items() if k != "file"}
        imp = {
            "format": self.fmt, "file": self.files[0] if len(self.files) == 1 else self.files,
            "coords": self.key.coords(), **info,
            "user_supplied": dict(self.sampling.user),
            "framework_defaults": {k: {"value": self.sampling.framework[k][0], "source": self.sampling.framework[k][1]}
                                   for k in sorted(self.from_framework)},
            "fields_missing": missing,
            "n_records": self.n_records, "n_sequences": self.n_sequences, "n_tokens": self.n_tokens,
            "n_records_without_sampled_tokens": self.n_records_without_sampled_tokens,
            "n_multi_turn_records": self.n_multi_turn_records,
            "excluded": {k: dict(v) for k, v in self.excluded.items()},
            "n_excluded_tokens": sum(e["tokens"] for e in self.excluded.values()),
            **({"prompt_tokenization": self.prompt_tokenization} if self.prompt_tokenization and self.n_prompt_texts
               else {}),
            "notes": notes,
        }
        out: dict[str, Any] = {"arm": self.arm, "capture_backend": f"import:{self.fmt}", "import": imp,
                               "sampling_unknown": sorted(self.unknown, key=SAMPLING_FIELDS.index)}
        trainer = self.trainer_attrs()
        if trainer is not None:
            out["trainer"] = trainer
        return out
