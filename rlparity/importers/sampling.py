"""Sampling parameters asked, never invented: the dump's, else the options', else the framework's
documented default, else stored as unknown (:data:`UNKNOWN_VALUE`) and listed; :func:`require_sampling`
turns an unknown one into an error naming the option that supplies it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from rlparity.importers.errors import ImportFormatError
from rlparity.trace import arm_record


SAMPLING_FIELDS = ("temperature", "top_k", "top_p")
#: how a sampling parameter nobody gave is stored: NaN for floats, -1 for top_k (0 = off)
UNKNOWN_VALUE = {"temperature": math.nan, "top_k": -1, "top_p": math.nan}
OPTION_FLAG = {"temperature": "--temperature 0.7", "top_k": "--top-k 50", "top_p": "--top-p 0.95"}
OPTION_KWARG = {"temperature": "temperature=0.7", "top_k": "top_k=50", "top_p": "top_p=0.95"}


class MissingSamplingError(ValueError):
    """A check needs a sampling parameter the dump did not record and nobody supplied."""


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
