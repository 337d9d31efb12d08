"""Is my number normal: the baseline table shipped with the package, and where a number falls in it.

A row is keyed by the setting that sets the floor of the backend pair (pi_old, mu):
:data:`KEY_FIELDS` = model ``family`` (dense / moe), ``dtype`` (the engine's; ``engine/trainer``
when they differ), ``engine`` (with its version), ``attention_backend``, ``head`` (the LM head's
precision on each side) and ``device``. Its **units** are clean batches: one arm of a capture, or
one step of a run, with no fault declared (:func:`is_clean`). Each unit gives one value per
metric of :data:`METRICS` (mean ``|d|``, mean ``k3``, band shares: :func:`unit_values`); the row
keeps them all (sorted) with its percentiles and what it was measured on (stores, arms, runs,
units, tokens). A row from fewer than ``defaults().baseline_min_runs`` runs says so.

:func:`place` puts a user's number in the row of its key (or the nearest row, naming the fields
that differ): its percentile is the mid-rank empirical CDF of the row's units,
``100 * (#{v < x} + #{v == x} / 2) / n``.

The table is built by ``scripts/build_baselines.py`` (:func:`build_rows`) and read by
:func:`load_baselines`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.metrics.sequences import backend_log_ratio, band_shares

KEY_FIELDS = ("family", "dtype", "engine", "attention_backend", "head", "device")
# how much a differing field moves the floor: the nearest row differs in the fewest fields, then the lightest
FIELD_WEIGHT = {"dtype": 32, "head": 16, "family": 8, "engine": 4, "attention_backend": 2, "device": 1}
METRICS = ("abs_log_ratio_mean", "kl_k3", "above_ln2_token_share")
PERCENTILES = (5, 25, 50, 75, 95)
BASELINE_FILE = "baselines.json"


def _get(attrs: Mapping[str, Any], name: str) -> dict[str, Any]:
    v = attrs.get(name)
    return v if isinstance(v, Mapping) else {}


def _short(dtype: Any) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(str(dtype), str(dtype))


def _head(side: Mapping[str, Any]) -> Any:
    """A side's LM-head dtype: its body's where it names none (or ``"model"``: the body's)."""
    head = side.get("head_dtype")
    return head if head not in (None, "model") else side.get("dtype", "?")


def baseline_key(attrs: Mapping[str, Any], *, device: str | None = None) -> dict[str, str]:
    """The baseline key of one arm or step from its provenance attrs.

    Parameters
    ----------
    attrs : Mapping
        The trace's attrs (``engine_effective``, ``trainer``, ``versions``, ``routing_capture``,
        ``capture_backend``; ``engine_given``, the settings a training loop named, for what
        ``engine_effective`` does not say: a run store's steps, :func:`rlparity.record.step_trace`).
    device : str, optional
        The device when the attrs do not name the card (e.g. ``"H200"`` for a shipped ``h200-*``
        example); None: the trainer's device (``cuda`` / ``cpu``).

    Returns
    -------
    dict[str, str]
        One value per :data:`KEY_FIELDS` (``"?"`` where the attrs do not say).
    """
    eng, given, tr = _get(attrs, "engine_effective"), _get(attrs, "engine_given"), _get(attrs, "trainer")
    if given:  # what the engine reported, else what the loop named (never a default: unnamed stays "?")
        eng = {**given, **{k: v for k, v in eng.items() if v is not None}}
    ver = _get(attrs, "versions")
    routing = _get(attrs, "routing_capture")
    moe = routing.get("mode") is not None or bool(_get(attrs, "moe_experiment").get("moe"))
    e_dt, t_dt = _short(eng.get("dtype", "?")), _short(tr.get("dtype", "?"))
    e_head, t_head = _short(_head(eng)), _short(_head(tr))
    vllm = ver.get("vllm")
    return {"family": "moe" if moe else "dense",
            "dtype": e_dt if e_dt == t_dt else f"{e_dt}/{t_dt}",
            "engine": f"vllm {vllm}" if vllm else str(attrs.get("capture_backend", "?")),
            "attention_backend": str(eng.get("attention_backend", "?")),
            "head": f"{e_head} head" if e_head == t_head else f"{e_head} engine / {t_head} trainer head",
            "device": device or str(tr.get("device", "?"))}


def is_clean(attrs: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether an arm or step is a clean batch (no fault declared), and why not.

    Not clean: a declared fault (``faults.causes``), a layer scenario other than ``clean``, raw
    engine log-probabilities (``logprobs_mode`` raw: a semantic mismatch against the processed
    trainer), or a weight update that kept the prefix cache while it was on (stale KV).

    Parameters
    ----------
    attrs : Mapping
        The trace's attrs.

    Returns
    -------
    tuple of (bool, str)
        Clean, and the reason when not ("" when clean).
    """
    causes = _get(attrs, "faults").get("causes") or []
    if causes:
        return False, "fault " + "+".join(map(str, causes))
    scen = attrs.get("layer_scenario")
    if scen not in (None, "clean"):
        return False, f"layer scenario {scen}"
    eng = _get(attrs, "engine_effective")
    # what the engine reported, else what a recorded loop named (engine_given: a run store's steps)
    mode = eng.get("logprobs_mode") or _get(attrs, "engine_given").get("logprobs_mode") or ""
    if str(mode).startswith("raw"):
        return False, "raw engine logprobs"
    ups = attrs.get("weight_updates") or []
    if eng.get("enable_prefix_caching") and any(isinstance(u, Mapping) and u.get("cache_reset") is False for u in ups):
        return False, "prefix cache kept over a weight update"
    return True, ""


def unit_values(trace: xr.Dataset) -> dict[str, float]:
    """The metrics of one clean batch (the backend pair, the trace's trainer side).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm or step.

    Returns
    -------
    dict[str, float]
        ``abs_log_ratio_mean`` and ``kl_k3`` (nats, over real tokens with a finite ``d``),
        ``above_ln2_token_share`` and ``band_<name>`` (the token share in each
        ``defaults().ratio_bands``), ``n_tokens``.
    """
    d, mask, _ = backend_log_ratio(trace, None)
    fin = mask & np.isfinite(d)
    x = d[fin]
    s = band_shares(d, mask)
    out = {"abs_log_ratio_mean": float(np.abs(x).mean()) if x.size else float("nan"),
           "kl_k3": float((np.expm1(x) - x).mean()) if x.size else float("nan"),
           "above_ln2_token_share": s["above_ln2_token_share"], "n_tokens": s["n_tokens"]}
    out.update({f"band_{k}": v for k, v in s["token_share"].items()})
    return out


def percentile_of(x: float, values: Iterable[float]) -> float:
    """Mid-rank empirical percentile of ``x`` among ``values``: ``100 (#{v < x} + #{v == x}/2) / n``.

    Parameters
    ----------
    x : float
        The number placed.
    values : iterable of float
        The row's unit values (NaN left out).

    Returns
    -------
    float
        In [0, 100]; NaN when there is no value or ``x`` is NaN.
    """
    v = np.asarray([u for u in values if np.isfinite(u)], dtype=float)
    if v.size == 0 or not np.isfinite(x):
        return float("nan")
    return float(100.0 * ((v < x).sum() + 0.5 * (v == x).sum()) / v.size)


@dataclass
class BaselineRow:
    """One row: its key, its unit values per metric and what it was measured on.

    Parameters
    ----------
    key : dict[str, str]
        One value per :data:`KEY_FIELDS`.
    values : dict[str, list of float]
        Per metric, one value per unit.
    sources : dict[str, list of str]
        Per store, its units (arms or ``run@step``).
    runs : list of str
        The runs (``store:run``) the units belong to.
    n_tokens : int
        Real tokens over the units.
    """

    key: dict[str, str]
    values: dict[str, list[float]] = field(default_factory=dict)
    sources: dict[str, list[str]] = field(default_factory=dict)  # store -> units (arm or run@step)
    runs: list[str] = field(default_factory=list)
    n_tokens: int = 0

    @property
    def n_units(self) -> int:
        """Units (clean batches) in the row.

        Returns
        -------
        int
            Their number.
        """
        return sum(len(v) for v in self.sources.values())

    @property
    def few(self) -> bool:
        """Whether the row comes from fewer than ``defaults().baseline_min_runs`` runs.

        Returns
        -------
        bool
            True when too few.
        """
        return len(self.runs) < defaults().baseline_min_runs

    def to_dict(self) -> dict[str, Any]:
        """The row as plain data (what ``baselines.json`` holds).

        Returns
        -------
        dict
            ``key``, ``n_runs``, ``n_units``, ``n_tokens``, ``runs``, ``sources``, ``few_runs``,
            ``percentiles`` (per metric, :data:`PERCENTILES`) and ``values`` (sorted).
        """
        pct = {m: {f"p{q}": float(np.nanpercentile(v, q)) if np.isfinite(v).any() else None for q in PERCENTILES}
               for m, v in self.values.items()}
        return {"key": self.key, "n_runs": len(self.runs), "n_units": self.n_units, "n_tokens": self.n_tokens,
                "runs": self.runs, "sources": self.sources, "few_runs": self.few, "percentiles": pct,
                "values": {m: sorted(v) for m, v in self.values.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BaselineRow:
        """A row from :meth:`to_dict`'s data.

        Parameters
        ----------
        d : Mapping
            The row's data.

        Returns
        -------
        BaselineRow
            The row.
        """
        return cls(dict(d["key"]), {m: list(v) for m, v in d["values"].items()},
                   {s: list(u) for s, u in d["sources"].items()}, list(d["runs"]), int(d["n_tokens"]))


def build_rows(units: Iterable[tuple[str, str, str, xr.Dataset, str | None]]) -> list[BaselineRow]:
    """Rows from clean units.

    Parameters
    ----------
    units : iterable of (store, run, unit, trace, device)
        One scored batch each: the store it is read from, the run it belongs to (an arm's own
        name for a one-shot capture), the unit's name (arm or ``run@step``), the trace, and the
        device hint of :func:`baseline_key`. Units that are not clean (:func:`is_clean`) are
        skipped.

    Returns
    -------
    list[BaselineRow]
        One row per key, sorted by key.
    """
    rows: dict[tuple, BaselineRow] = {}
    for store, run, unit, trace, device in units:
        if not is_clean(trace.attrs)[0]:
            continue
        key = baseline_key(trace.attrs, device=device)
        row = rows.setdefault(tuple(key[f] for f in KEY_FIELDS), BaselineRow(key))
        vals = unit_values(trace)
        row.n_tokens += int(vals.pop("n_tokens"))
        for m, v in vals.items():
            row.values.setdefault(m, []).append(float(v))
        row.sources.setdefault(store, []).append(unit)
        run_id = f"{store}:{run}"
        if run_id not in row.runs:
            row.runs.append(run_id)
    return [rows[k] for k in sorted(rows)]


def load_baselines(path: str | Path | None = None) -> list[BaselineRow]:
    """The baseline table (default: the one shipped in ``rlparity/data``).

    Parameters
    ----------
    path : str or Path, optional
        A table written by ``scripts/build_baselines.py``.

    Returns
    -------
    list[BaselineRow]
        The rows.
    """
    if path is None:
        text = resources.files("rlparity.data").joinpath(BASELINE_FILE).read_text()
    else:
        text = Path(path).read_text()
    data = json.loads(text)
    return [BaselineRow.from_dict(r) for r in data["rows"]]


def nearest_row(key: Mapping[str, str], rows: Iterable[BaselineRow]) -> tuple[BaselineRow, list[str]]:
    """The row of ``key``, or the nearest: the fewest differing fields, then the lightest
    differences (:data:`FIELD_WEIGHT`: dtype, then head, family, engine, attention backend,
    device), then the most units.

    Parameters
    ----------
    key : Mapping[str, str]
        A key of :data:`KEY_FIELDS` (missing fields match nothing).
    rows : iterable of BaselineRow
        The table.

    Returns
    -------
    tuple of (BaselineRow, list of str)
        The row and the fields in which it differs from ``key``.

    Raises
    ------
    ValueError
        If the table is empty.
    """
    best = None
    for row in rows:
        diff = [f for f in KEY_FIELDS if row.key.get(f) != key.get(f)]
        weight = sum(FIELD_WEIGHT[f] for f in diff)
        rank = (len(diff), weight, -row.n_units)
        if best is None or rank < best[0]:
            best = (rank, row, diff)
    if best is None:
        raise ValueError("the baseline table is empty: build it with scripts/build_baselines.py")
    return best[1], best[2]


def describe_key(key: Mapping[str, str]) -> str:
    """A row's key in words, e.g. ``dense bf16 on vllm 0.26.0 (FLASH_ATTN) with a fp32 head, H200``.

    Parameters
    ----------
    key : Mapping[str, str]
        A key of :data:`KEY_FIELDS`.

    Returns
    -------
    str
        The key in words.
    """
    return (f"{key.get('family', '?')} {key.get('dtype', '?')} on {key.get('engine', '?')} "
            f"({key.get('attention_backend', '?')}) with a {key.get('head', '?')}, {key.get('device', '?')}")


def place(value: float, metric: str, key: Mapping[str, str], rows: Iterable[BaselineRow] | None = None
          ) -> dict[str, Any]:
    """Where a number falls in the baseline table.

    Parameters
    ----------
    value : float
        The user's number (e.g. a step's mean ``|d|``, nats).
    metric : str
        One of the row's metrics (:data:`METRICS` or ``band_<name>``).
    key : Mapping[str, str]
        The user's setting (:func:`baseline_key` of the trace's attrs).
    rows : iterable of BaselineRow, optional
        The table (default :func:`load_baselines`).

    Returns
    -------
    dict
        ``percentile``, ``metric``, ``value``, ``row`` (its key), ``exact`` (the key matched),
        ``differs`` (``{field: (yours, row's)}``), ``n_runs``, ``n_units``, ``few_runs``, ``sources``
        and ``text`` (e.g. ``p93 of dense bf16 runs on vllm 0.26.0 ...``).

    Raises
    ------
    ValueError
        If the metric is not in the row.
    """
    row, diff = nearest_row(key, load_baselines() if rows is None else rows)
    if metric not in row.values:
        raise ValueError(f"metric={metric!r} is not in the baseline table; use one of {sorted(row.values)}")
    p = percentile_of(value, row.values[metric])
    text = f"p{p:.0f} of {row.n_units} clean batches ({len(row.runs)} runs) of {describe_key(row.key)}"
    if diff:
        text += "; nearest row, differs in " + ", ".join(f"{f} (yours {key.get(f)}, row {row.key[f]})" for f in diff)
    if row.few:
        text += f"; from too few runs (< {defaults().baseline_min_runs}): a rough guide, not a distribution"
    return {"percentile": p, "metric": metric, "value": float(value), "row": dict(row.key), "exact": not diff,
            "differs": {f: (key.get(f), row.key[f]) for f in diff}, "n_runs": len(row.runs),
            "n_units": row.n_units, "few_runs": row.few, "sources": row.sources, "text": text}


__all__ = ["BASELINE_FILE", "FIELD_WEIGHT", "KEY_FIELDS", "METRICS", "PERCENTILES", "BaselineRow", "baseline_key", "build_rows",
           "describe_key", "is_clean", "load_baselines", "nearest_row", "percentile_of", "place", "unit_values"]
