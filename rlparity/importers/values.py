"""Per-record values read from a dump and checked, each error naming the file, the record and the
field: integers, numbers, rewards, per-token arrays, required fields, arm names."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlparity.importers.errors import ImportFormatError


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
