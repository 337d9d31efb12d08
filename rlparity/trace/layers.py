"""The per-layer data model: which states of a decoder stack are compared ("sites"), in data-flow
order, and the trace variables that hold the divergence profile of an arm.

A **site** is one module's output at one layer, named the same way on both sides (vLLM and
transformers share the Llama-family submodule names ``input_layernorm``, ``self_attn``,
``post_attention_layernorm``, ``mlp``):

* ``embedding`` (layer -1): the token embeddings;
* per decoder layer ``l``: ``input_norm`` (the normed input of attention), ``attention`` (the
  attention block's output, before the residual add), ``post_attention_norm`` (the normed input
  of the MLP), ``mlp`` (the MLP's output), ``output`` (the residual stream after the layer: in
  vLLM the sum of the ``(hidden, residual)`` pair a layer returns, in transformers the layer's
  output);
* ``final_norm`` and ``lm_head`` (layer ``n_layers``): the normed last state, and the logits at a
  fixed sample of vocabulary columns (the same columns on both sides).

The order of :func:`sites` is the order the states are computed in, so "the first site that leaves
its floor" is where a divergence enters.

Trace variables (dims ``site``, ``layer_sequence``: one token sequence the layer capture ran,
``full_position``: the index in its prompt + response): :data:`LAYER_VARS`. The sequences are the
probe: a layer capture runs the engine and the reference on the same token ids (an arm's own
sampled sequences, or one shared set for every arm of an experiment, so arms compare position by
position); ``attrs["layer_capture"]`` says which. Relative error = ``layer_diff_rms /
layer_state_rms`` per position (RMS over the hidden dimension, or over the vocabulary columns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

# module -> the submodule name on both sides (None: not a submodule of a decoder layer)
LAYER_MODULES = ("input_norm", "attention", "post_attention_norm", "mlp", "output")
SUBMODULES = {"input_norm": "input_layernorm", "attention": "self_attn",
              "post_attention_norm": "post_attention_layernorm", "mlp": "mlp"}
# the checkpoint tensors (Hugging Face names, after "model.layers.<l>.") each module's output depends on
MODULE_TENSORS = {
    "embedding": ("model.embed_tokens.weight",),
    "input_norm": ("input_layernorm.weight",),
    "attention": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                  "self_attn.o_proj.weight"),
    "post_attention_norm": ("post_attention_layernorm.weight",),
    "mlp": ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"),
    "output": (),
    "final_norm": ("model.norm.weight",),
    "lm_head": ("lm_head.weight",),
}
SITE_DIM, SEQUENCE_DIM, POSITION_DIM = "site", "layer_sequence", "full_position"
LAYER_DIMS = (SITE_DIM, SEQUENCE_DIM, POSITION_DIM)
LAYER_VARS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "layer_diff_rms": (LAYER_DIMS, "f", "RMS over the hidden dimension (the vocabulary columns for lm_head) of the "
                                        "engine's state minus the reference's, per position (NaN: not computed)"),
    "layer_state_rms": (LAYER_DIMS, "f", "RMS of the reference's state at the same site and position"),
    "layer_floor": ((SITE_DIM,), "f", "relative error per site that a clean parity arm reaches (the floor the "
                                      "profile is judged against; NaN = not measured)"),
    "layer_cached": ((SEQUENCE_DIM,), "i", "leading positions the engine served from its prefix cache in the layer "
                                           "capture (their states were not recomputed there)"),
    "layer_length": ((SEQUENCE_DIM,), "i", "prompt + response tokens of the sequence"),
    "layer_token_id": ((SEQUENCE_DIM, POSITION_DIM), "i", "the token ids the layer capture ran (-1 = padding)"),
}


def sites(n_layers: int) -> list[tuple[int, str]]:
    """The sites of a decoder stack in data-flow order.

    Parameters
    ----------
    n_layers : int
        Decoder layers of the stack.

    Returns
    -------
    list[tuple[int, str]]
        ``(layer, module)``: ``(-1, "embedding")``, the :data:`LAYER_MODULES` of each layer, then
        ``(n_layers, "final_norm")`` and ``(n_layers, "lm_head")``.
    """
    out = [(-1, "embedding")]
    for layer in range(n_layers):
        out += [(layer, m) for m in LAYER_MODULES]
    return out + [(n_layers, "final_norm"), (n_layers, "lm_head")]


def site_label(layer: int, module: str) -> str:
    """The label of a site: ``"L3.attention"``; ``"embedding"``, ``"final_norm"``, ``"lm_head"`` outside the layers.

    Parameters
    ----------
    layer : int
        The site's layer.
    module : str
        The site's module.

    Returns
    -------
    str
        The label.
    """
    return module if module in ("embedding", "final_norm", "lm_head") else f"L{layer}.{module}"


def site_tensors(layer: int, module: str) -> list[str]:
    """The checkpoint tensors (Hugging Face names) a site's own computation reads.

    Parameters
    ----------
    layer : int
        The site's layer.
    module : str
        The site's module.

    Returns
    -------
    list[str]
        Tensor names (``model.layers.<layer>.`` prefixed inside a layer); empty for ``output``.
    """
    names = MODULE_TENSORS.get(module, ())
    if module in LAYER_MODULES:
        return [f"model.layers.{layer}.{n}" for n in names]
    return list(names)


def site_coords(site_list: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """Coordinates of the ``site`` dim: labels, ``site_layer`` and ``site_module``.

    Parameters
    ----------
    site_list : sequence of tuple[int, str]
        ``(layer, module)`` per site, as :func:`sites` lists them.

    Returns
    -------
    dict[str, Any]
        ``site`` (labels), ``site_layer`` (int64) and ``site_module`` (str), for ``assign_coords``.
    """
    return {SITE_DIM: [site_label(li, m) for li, m in site_list],
            "site_layer": (SITE_DIM, np.array([li for li, _ in site_list], dtype=np.int64)),
            "site_module": (SITE_DIM, np.array([m for _, m in site_list], dtype=str))}


def vocab_columns(vocab_size: int, n: int = 1024, seed: int = 0) -> list[int]:
    """The vocabulary columns the ``lm_head`` site compares.

    All of them up to ``n``, else a seeded sorted sample of ``n``: the RMS over a random sample of
    columns estimates the RMS of the row.

    Parameters
    ----------
    vocab_size : int
        Columns of the LM head.
    n : int, default 1024
        Most columns compared.
    seed : int, default 0
        Seed of the sample.

    Returns
    -------
    list[int]
        Column indices, sorted.
    """
    if vocab_size <= n:
        return list(range(vocab_size))
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(vocab_size, size=n, replace=False))


def layer_dataset(site_list: Sequence[tuple[int, str]], diff_rms: np.ndarray, state_rms: np.ndarray,
                  token_ids: Sequence[Sequence[int]], cached: Sequence[int], *, floor: np.ndarray | None = None,
                  attrs: dict[str, Any] | None = None) -> xr.Dataset:
    """The layer variables of one arm (:data:`LAYER_VARS`).

    Parameters
    ----------
    site_list : sequence of tuple[int, str]
        ``(layer, module)`` per site, as :func:`sites` lists them.
    diff_rms : numpy.ndarray
        ``(site, layer_sequence, full_position)``: RMS of the engine's state minus the reference's
        (NaN where nothing was compared).
    state_rms : numpy.ndarray
        The reference state's RMS, the shape of ``diff_rms``.
    token_ids : sequence of sequence of int
        The token ids of each sequence run (prompt + response).
    cached : sequence of int
        Per sequence, the leading positions the engine served from its prefix cache.
    floor : numpy.ndarray, optional
        The floor per site; ``None`` leaves it NaN (not measured).
    attrs : dict[str, Any], optional
        The ``layer_capture`` record (how the capture ran).

    Returns
    -------
    xarray.Dataset
        The variables of :data:`LAYER_VARS` with the site coordinates and ``attrs["layer_capture"]``.

    Raises
    ------
    ValueError
        ``diff_rms`` and ``state_rms`` differ in shape or do not have one row per site, or ``floor``
        has not one value per site.
    """
    from rlparity.trace.schema import pad_rows

    diff_rms, state_rms = np.asarray(diff_rms, dtype=np.float64), np.asarray(state_rms, dtype=np.float64)
    if diff_rms.shape != state_rms.shape or diff_rms.ndim != 3 or diff_rms.shape[0] != len(site_list):
        raise ValueError(f"diff_rms {diff_rms.shape} and state_rms {state_rms.shape} must both be "
                         f"(site={len(site_list)}, sequence, full_position)")
    n_sites = len(site_list)
    fl = np.full(n_sites, np.nan) if floor is None else np.asarray(floor, dtype=np.float64)
    if fl.shape != (n_sites,):
        raise ValueError(f"floor has shape {fl.shape}, expected ({n_sites},): one value per site")
    ds = xr.Dataset({"layer_diff_rms": (LAYER_DIMS, diff_rms), "layer_state_rms": (LAYER_DIMS, state_rms),
                     "layer_floor": ((SITE_DIM,), fl),
                     "layer_cached": ((SEQUENCE_DIM,), np.asarray(cached, dtype=np.int64)),
                     "layer_length": ((SEQUENCE_DIM,), np.array([len(t) for t in token_ids], dtype=np.int64)),
                     "layer_token_id": ((SEQUENCE_DIM, POSITION_DIM),
                                        pad_rows(token_ids, -1, np.int64, width=diff_rms.shape[2]))},
                    coords=site_coords(site_list), attrs={"layer_capture": dict(attrs or {})})
    for name, var in ds.data_vars.items():
        var.attrs["long_name"] = LAYER_VARS[name][2]
    return ds


# ------------------------------------------------------------------------------ sites on a module tree
def decoder_stack(model: Any) -> Any:
    """The module holding ``layers``, ``embed_tokens`` and ``norm``.

    ``model.model`` for the Llama family in vLLM and transformers alike.

    Parameters
    ----------
    model : torch.nn.Module
        A vLLM or transformers causal LM.

    Returns
    -------
    torch.nn.Module
        The decoder stack.

    Raises
    ------
    ValueError
        No submodule has ``.layers`` and ``.norm``.
    """
    for path in ("model", "language_model.model", "model.language_model", ""):
        mod = model
        for part in [p for p in path.split(".") if p]:
            mod = getattr(mod, part, None)
            if mod is None:
                break
        if mod is not None and hasattr(mod, "layers") and hasattr(mod, "norm"):
            return mod
    raise ValueError(f"{type(model).__name__} has no decoder stack with .layers and .norm (model.model for "
                     "Llama-family models): per-layer capture supports those architectures")


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _layer_output(out: Any) -> Any:
    """The residual stream after a decoder layer: vLLM's ``hidden + residual``, transformers' output."""
    if isinstance(out, (tuple, list)) and len(out) == 2 and out[1] is not None and hasattr(out[1], "shape") \
            and out[1].shape == out[0].shape:
        return out[0] + out[1]  # in the model's dtype, as the next layer's fused add computes it
    return _first(out)


def site_modules(stack: Any) -> list[tuple[Any, Any]]:
    """The module of each site and how to read its output, on vLLM's and transformers' stacks alike.

    Every site of :func:`rlparity.trace.layers.sites` except ``lm_head`` (computed from the final
    norm).

    Parameters
    ----------
    stack : torch.nn.Module
        A decoder stack (:func:`decoder_stack`).

    Returns
    -------
    list[tuple[Any, Any]]
        ``(module, read)`` per site: ``read`` turns the module's forward output into the site's state.

    Raises
    ------
    ValueError
        A decoder layer lacks one of the Llama-family submodules.
    """
    out: list[tuple[Any, Any]] = [(stack.embed_tokens, _first)]
    for layer in stack.layers:
        for module in LAYER_MODULES:
            if module == "output":
                out.append((layer, _layer_output))
            else:
                sub = getattr(layer, SUBMODULES[module], None)
                if sub is None:
                    raise ValueError(f"decoder layer {type(layer).__name__} has no {SUBMODULES[module]}: per-layer "
                                     "capture supports Llama-family layers (input_layernorm, self_attn, "
                                     "post_attention_layernorm, mlp)")
                out.append((sub, _first))
    out.append((stack.norm, _first))
    return out


class SiteHooks:
    """Forward hooks that copy every site's output (except ``lm_head``) at each forward of a decoder stack.

    vLLM's or transformers': ``calls`` holds, per forward, the ids and positions it ran and
    ``{site index: copy of the output}``. Copies are taken when each hook fires: vLLM's fused norms
    update their inputs in place afterwards.

    Parameters
    ----------
    stack : torch.nn.Module
        A decoder stack (:func:`decoder_stack`); the hooks are registered on it at once.
    """

    def __init__(self, stack: Any):
        self.stack = stack
        self.calls: list[dict[str, Any]] = []
        # the stack's own hooks may not fire (vLLM's compile wrapper calls its forward directly): a
        # forward starts at the embedding, its positions are the first decoder layer's
        self.handles = [stack.embed_tokens.register_forward_pre_hook(self._start),
                        stack.layers[0].register_forward_pre_hook(self._positions, with_kwargs=True)]
        for k, (mod, read) in enumerate(site_modules(stack)):
            self.handles.append(mod.register_forward_hook(self._keep(k, read)))

    def _start(self, module, args):
        ids = args[0] if args else None
        self.calls.append({"ids": None if ids is None else ids.detach().clone(), "positions": None, "sites": {}})

    def _positions(self, module, args, kwargs):
        pos = kwargs.get("positions", kwargs.get("position_ids"))
        if pos is None and args and not args[0].is_floating_point():
            pos = args[0]
        if self.calls and pos is not None:
            self.calls[-1]["positions"] = pos.detach().clone()

    def _keep(self, k: int, read):
        def hook(module, args, out):
            if self.calls:
                self.calls[-1]["sites"][k] = read(out).detach().clone()
        return hook

    def remove(self) -> None:
        """Remove every hook this object registered."""
        for h in self.handles:
            h.remove()
        self.handles = []


def has_layers(ds: xr.Dataset) -> bool:
    """Whether a trace carries a layer profile.

    Parameters
    ----------
    ds : xarray.Dataset
        A trace or layer dataset.

    Returns
    -------
    bool
        True when ``layer_diff_rms`` is there.
    """
    return "layer_diff_rms" in ds.variables


def with_layers(trace: xr.Dataset, layers: xr.Dataset) -> xr.Dataset:
    """``trace`` with the layer variables of ``layers`` and its ``attrs["layer_capture"]``.

    A previous profile is replaced.

    Parameters
    ----------
    trace : xarray.Dataset
        The arm's trace.
    layers : xarray.Dataset
        A layer dataset (:func:`layer_dataset`).

    Returns
    -------
    xarray.Dataset
        A new trace; ``trace`` is unchanged.
    """
    old = [v for v in list(trace.variables) if v in LAYER_VARS or v in (SITE_DIM, "site_layer", "site_module")]
    base = trace.drop_vars(old, errors="ignore")
    if POSITION_DIM in base.dims or SEQUENCE_DIM in base.dims:
        base = base.drop_dims([d for d in (POSITION_DIM, SEQUENCE_DIM) if d in base.dims])
    out = base.assign({k: layers[k].variable for k in LAYER_VARS if k in layers})
    out = out.assign_coords({c: layers[c].variable for c in (SITE_DIM, "site_layer", "site_module")})
    out.attrs = {**trace.attrs, "layer_capture": layers.attrs.get("layer_capture", {})}
    return out


def site_list(ds: xr.Dataset) -> list[tuple[int, str]]:
    """The ``(layer, module)`` of each site of a profile, in order.

    Parameters
    ----------
    ds : xarray.Dataset
        A trace or layer dataset with site coordinates.

    Returns
    -------
    list[tuple[int, str]]
        One pair per site.
    """
    return list(zip(ds["site_layer"].values.tolist(), ds["site_module"].values.tolist()))


__all__ = ["LAYER_DIMS", "LAYER_MODULES", "LAYER_VARS", "MODULE_TENSORS", "POSITION_DIM", "SEQUENCE_DIM", "SITE_DIM",
           "SUBMODULES", "SiteHooks", "decoder_stack", "has_layers", "layer_dataset", "site_coords",
           "site_label", "site_list", "site_modules", "site_tensors", "sites", "vocab_columns", "with_layers"]
