"""Per-layer hidden states and live weights of a running vLLM engine, through rlparity's worker
extension (no insecure serialization: named methods, plain data back).

Worker side, :class:`LayerCaptureExtension` (a mixin of
:class:`~rlparity.capture.weights.WeightUpdateExtension`, the ``worker_extension_cls`` rlparity
engines run with):

* ``rlparity_layers_start(vocab_ids)`` registers forward hooks on the model's decoder stack (the
  embeddings, every decoder layer's ``input_layernorm``, ``self_attn``,
  ``post_attention_layernorm``, ``mlp`` and the layer itself, the final norm); every forward the
  engine runs from then on keeps a copy of those outputs (and the positions and token ids it ran).
  vLLM's fused norms update their inputs in place, so each output is copied when its hook fires.
  A decoder layer returns ``(hidden, residual)``: the residual stream after it is their sum.
* ``rlparity_layers_take()`` returns what the hooks kept since the last call (per site, in the
  order of :func:`rlparity.trace.layers.sites`; 16-bit states are sent as their raw bits, exactly),
  plus the engine's logits at ``vocab_ids``, computed by the engine's own head
  (``model.compute_logits``, so ``head_dtype`` applies) from the final-norm states;
* ``rlparity_layers_stop()`` removes the hooks;
* ``rlparity_weight_checksums()`` returns per-tensor checksums of the weights the engine runs
  now, in Hugging Face checkpoint names: vLLM's fused ``qkv_proj`` and ``gate_up_proj`` are split
  back into ``q/k/v_proj`` and ``gate/up_proj`` (by the layer's ``output_sizes``); a linear layer
  whose weight the CPU build repacked for its GEMM kernel (the parameter left empty) is read back
  through that kernel (the identity matrix times the weight: exact).

Engine side: :func:`capture_layers` (a prefill of each prompt + response with ``max_tokens=1``,
one sequence at a time, between the start and stop calls) and :func:`live_checksums`.

The hooks fire only where the model runs eagerly: a compiled model (the CPU build's default, or
CUDA graphs on a GPU) runs its graph without calling the hooks. :func:`capture_layers` checks that
they fired and otherwise says to start the engine with ``enforce_eager=True``; a profile therefore
describes the **eager** path of the engine.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlparity.trace.layers import SiteHooks, decoder_stack, site_modules, sites

START_METHOD = "rlparity_layers_start"
TAKE_METHOD = "rlparity_layers_take"
STOP_METHOD = "rlparity_layers_stop"
CHECKSUM_METHOD = "rlparity_weight_checksums"
_HOOKS_ATTR = "_rlparity_layer_hooks"


# ------------------------------------------------------------------------------ worker side
def _pack(a: np.ndarray) -> dict[str, Any]:
    """An array as plain data for ``collective_rpc`` (vLLM's msgpack returns untyped numpy arrays
    as lists): ``{"dtype", "shape", "data": bytes}``."""
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes()}


def unpack(d: dict[str, Any]) -> np.ndarray:
    """The array a worker packed as plain data for ``collective_rpc``.

    Parameters
    ----------
    d : dict
        ``{"dtype": numpy dtype string, "shape": list of int, "data": bytes}``.

    Returns
    -------
    numpy.ndarray
        A read-only view of ``data`` with that dtype and shape.
    """
    return np.frombuffer(d["data"], dtype=np.dtype(d["dtype"])).reshape(d["shape"])


def _bits(t: Any) -> tuple[str, dict[str, Any]]:
    """``(dtype name, packed array)``: 16-bit floats as their raw bits (int16, exact), others as float32."""
    import torch

    t = t.detach().to("cpu").contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return str(t.dtype).removeprefix("torch."), _pack(t.view(torch.int16).numpy())
    return "float32", _pack(t.float().numpy())


def from_bits(dtype: str, packed: dict[str, Any]) -> np.ndarray:
    """The float32 values of a worker's packed states (16-bit floats are sent as their raw bits).

    Parameters
    ----------
    dtype : str
        The states' dtype name: ``"bfloat16"`` and ``"float16"`` mean ``packed`` holds their raw
        bits as int16; anything else means float32 values.
    packed : dict
        The packed array (see :func:`unpack`).

    Returns
    -------
    numpy.ndarray
        The values as float32 (exact: every bfloat16 and float16 value is a float32).
    """
    import torch

    array = unpack(packed)
    if dtype in ("bfloat16", "float16"):
        return torch.from_numpy(array.copy()).view(getattr(torch, dtype)).float().numpy()
    return np.asarray(array, dtype=np.float32)


def _device_memory(reset: bool = False) -> int:
    """On CUDA: the allocator's peak since the last reset (or, with ``reset``, what is allocated now,
    after resetting the peak); 0 elsewhere."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    if reset:
        torch.cuda.reset_peak_memory_stats()
        return int(torch.cuda.memory_allocated())
    return int(torch.cuda.max_memory_allocated())


def _worker_model(worker: Any) -> Any:
    runner = worker.model_runner
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


class LayerCaptureExtension:
    """Worker methods for per-layer capture and live weight checksums.

    A mixin of rlparity's worker extension; called by name through ``collective_rpc``.
    """

    def rlparity_layers_start(self, vocab_ids: list[int]) -> dict[str, Any]:
        """Install the hooks on the decoder stack (replacing earlier ones).

        Parameters
        ----------
        vocab_ids : list of int
            The vocabulary columns whose logits :meth:`rlparity_layers_take` returns.

        Returns
        -------
        dict
            The stack's shape: ``n_layers``, ``model`` (class name), ``dtype``, ``device``, ``n_sites``.
        """
        self.rlparity_layers_stop()
        model = _worker_model(self)
        stack = decoder_stack(model)
        hooks = SiteHooks(stack)
        hooks.vocab_ids = [int(i) for i in vocab_ids]  # type: ignore[attr-defined]
        hooks.device_base = _device_memory(reset=True)  # type: ignore[attr-defined]
        setattr(self, _HOOKS_ATTR, hooks)
        p = next(model.parameters())
        return {"n_layers": len(stack.layers), "model": type(model).__name__, "dtype": str(p.dtype).removeprefix("torch."),
                "device": str(p.device), "n_sites": len(sites(len(stack.layers)))}

    def rlparity_layers_take(self) -> dict[str, Any]:
        """What the hooks kept since the last call, then forget it.

        Per forward call the positions and ids; per site the states of every call, concatenated;
        the logits at ``vocab_ids`` from the engine's own head (``model.compute_logits`` on the
        final-norm states). Only calls in which every site fired count.

        Returns
        -------
        dict
            ``n_calls``, ``n_complete`` (calls with every site), ``positions`` and ``ids`` (packed
            int64), ``states`` (one packed array per site, in the order of
            :func:`rlparity.trace.layers.sites`), ``dtype``, ``logits`` (packed float32) and
            ``device_peak_extra_bytes``; without a complete call, empty arrays and no logits.

        Raises
        ------
        RuntimeError
            If no hooks are installed (call :meth:`rlparity_layers_start` first).
        """
        import torch

        hooks = getattr(self, _HOOKS_ATTR, None)
        if hooks is None:
            raise RuntimeError("no layer hooks: call rlparity_layers_start first")
        calls, hooks.calls = hooks.calls, []
        n_sites = len(site_modules(hooks.stack))
        complete = [c for c in calls if len(c["sites"]) == n_sites and c["positions"] is not None]
        out: dict[str, Any] = {"n_calls": len(calls), "n_complete": len(complete)}
        if not complete:
            out.update(positions=_pack(np.zeros(0, dtype=np.int64)), ids=_pack(np.zeros(0, dtype=np.int64)),
                       states=[], dtype="float32")
            return out
        pos = torch.cat([c["positions"].reshape(-1) for c in complete]).cpu().numpy().astype(np.int64)
        ids = torch.cat([c["ids"].reshape(-1) for c in complete]).cpu().numpy().astype(np.int64) \
            if all(c["ids"] is not None for c in complete) else np.full(pos.shape, -1, dtype=np.int64)
        states, dtype = [], "float32"
        with torch.no_grad():
            for k in range(n_sites):
                dtype, arr = _bits(torch.cat([c["sites"][k] for c in complete]))
                states.append(arr)
            final = torch.cat([c["sites"][n_sites - 1] for c in complete])
            model = _worker_model(self)
            cols = torch.tensor(hooks.vocab_ids, dtype=torch.long, device=final.device)
            logits = [model.compute_logits(final[s: s + 256]).index_select(-1, cols).float().cpu()
                      for s in range(0, final.shape[0], 256)]
        out.update(positions=_pack(pos), ids=_pack(ids), states=states, dtype=dtype,
                   logits=_pack(torch.cat(logits).numpy()),
                   device_peak_extra_bytes=max(_device_memory() - hooks.device_base, 0))
        hooks.device_base = _device_memory(reset=True)
        return out

    def rlparity_layers_stop(self) -> dict[str, Any]:
        """Remove the hooks (no-op without them).

        Returns
        -------
        dict
            ``{"removed": bool}``: whether there were hooks to remove.
        """
        hooks = getattr(self, _HOOKS_ATTR, None)
        if hooks is not None:
            hooks.remove()
            setattr(self, _HOOKS_ATTR, None)
        return {"removed": hooks is not None}

    def rlparity_weight_checksums(self) -> dict[str, Any]:
        """Per-tensor checksums of the weights the engine runs now, in Hugging Face checkpoint names.

        Checksums are :func:`rlparity.trace.weights.tensor_checksum`; see the module docstring for the
        fused layers and the CPU build's repacked weights.

        Returns
        -------
        dict
            ``checksums`` (``{name: checksum}``), ``probed`` (linear layers read through their kernel),
            ``unmapped`` (vLLM parameter names not mapped) and ``seconds`` (time taken).
        """
        t0 = time.perf_counter()
        sums, probed, unmapped = live_weight_checksums(_worker_model(self))
        return {"checksums": sums, "probed": probed, "unmapped": unmapped,
                "seconds": round(time.perf_counter() - t0, 4)}


def _probe_linear(module: Any, k: int) -> Any:
    """The ``(N, K)`` weight a linear layer multiplies with, read through its own kernel (rows of
    the identity matrix times the weight, no bias: exact in any float dtype)."""
    import torch

    dtype = getattr(module, "params_dtype", None) or torch.get_default_dtype()
    dev = next((b.device for b in module.buffers()), None) or torch.device("cpu")
    cols = []
    with torch.no_grad():
        for s in range(0, k, 1024):
            n = min(1024, k - s)
            eye = torch.zeros((n, k), dtype=dtype, device=dev)
            eye[torch.arange(n), torch.arange(s, s + n)] = 1
            cols.append(module.quant_method.apply(module, eye, None))
    return torch.cat(cols).t().contiguous()


def live_weight_checksums(model: Any) -> tuple[dict[str, str], int, list[str]]:
    """Checksums of a vLLM model's parameters in Hugging Face names (tensor parallel size 1).

    Fused ``qkv_proj`` / ``gate_up_proj`` tensors are split back by their ``output_sizes``;
    padded vocabulary rows are cut to ``org_vocab_size``; an empty (repacked) linear weight is
    read through its kernel.

    Parameters
    ----------
    model : torch.nn.Module
        The model a vLLM worker runs.

    Returns
    -------
    tuple of (dict of str to str, int, list of str)
        ``({hf name: checksum}, linear layers read through their kernel, vLLM names not mapped)``.
    """
    from rlparity.trace.weights import tensor_checksum

    packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
    out: dict[str, str] = {}
    unmapped: list[str] = []
    probed = 0
    for mod_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            t = p.detach()
            if t.numel() == 0:
                k = getattr(module, "input_size_per_partition", None) or getattr(module, "input_size", None)
                if pname != "weight" or not hasattr(module, "quant_method") or not k:
                    unmapped.append(f"{mod_name}.{pname}")
                    continue
                t = _probe_linear(module, int(k))
                probed += 1
            org = getattr(module, "org_vocab_size", None)
            if org and t.ndim == 2 and t.shape[0] > org:  # vLLM pads the vocabulary rows
                t = t[: int(org)]
            leaf = mod_name.rsplit(".", 1)[-1]
            prefix = mod_name[: len(mod_name) - len(leaf)]
            if leaf in packed and pname in ("weight", "bias"):
                sizes = list(getattr(module, "output_sizes", []) or [])
                parts = packed[leaf]
                if len(sizes) != len(parts) or sum(sizes) != t.shape[0]:
                    unmapped.append(f"{mod_name}.{pname}")
                    continue
                for sub, piece in zip(parts, t.split(sizes, dim=0)):
                    out[f"{prefix}{sub}.{pname}"] = tensor_checksum(piece)
            else:
                out[f"{mod_name}.{pname}"] = tensor_checksum(t)
    return out, probed, unmapped


# ------------------------------------------------------------------------------ engine side
def _llm(engine: Any) -> Any:
    """The ``vllm.LLM`` of an rlparity :class:`~rlparity.capture.Engine` or a ``vllm.LLM`` itself."""
    llm = getattr(engine, "llm", engine)
    if not hasattr(llm, "collective_rpc") or not hasattr(llm, "generate"):
        raise TypeError(f"{type(engine).__name__}: pass an rlparity Engine or a vllm.LLM (the offline engine); "
                        "per-layer capture runs a prefill with LLM.generate")
    return llm


def _rpc(llm: Any, method: str, *args: Any) -> Any:
    try:
        res = llm.collective_rpc(method, args=args)
    except Exception as err:
        raise RuntimeError(f"the workers could not run {method}: {err} (is rlparity's worker extension, "
                           "rlparity.capture.weights.WeightUpdateExtension, the engine's worker_extension_cls?)") from err
    if not res:
        raise RuntimeError(f"{method}: no worker answered")
    if len(res) > 1:
        raise NotImplementedError(f"{method}: {len(res)} workers answered; per-layer capture and live checksums "
                                  "support tensor/pipeline parallel size 1")
    return res[0]


def capture_layers(engine: Any, sequences: Sequence[Sequence[int]], *, vocab_ids: Sequence[int],
                   use_cache: bool = False) -> list[dict[str, Any]]:
    """Per-layer states of the engine on each token sequence (prompt + response ids).

    A prefill with ``max_tokens=1``, one sequence at a time, hooks on (see the module docstring).

    Parameters
    ----------
    engine : Engine or vllm.LLM
        An rlparity offline :class:`~rlparity.capture.Engine` or a ``vllm.LLM``, running eagerly
        (``enforce_eager=True``) with rlparity's worker extension.
    sequences : sequence of sequence of int
        The token ids of each sequence.
    vocab_ids : sequence of int
        The vocabulary columns whose logits are returned.
    use_cache : bool, default False
        ``False`` salts every request (``cache_salt``) so nothing comes from the prefix cache and
        every position is computed by the weights the engine holds now; ``True`` lets requests hit
        the cache as the engine's own requests would (a stale cache then shows).

    Returns
    -------
    list of dict
        Per sequence ``states`` (``(n_sites, T, H)`` float32), ``logits`` (``(T, len(vocab_ids))``),
        ``positions`` (``(T,)``), ``cached`` (the first computed position: positions served from
        the cache are absent), ``length``, ``dtype``, ``n_layers``, ``payload_bytes`` and
        ``device_peak_extra_bytes``.

    Raises
    ------
    TypeError
        If ``engine`` is neither an rlparity Engine nor a ``vllm.LLM``.
    RuntimeError
        If the workers cannot run the extension's methods, the hooks did not fire (a compiled
        model: start the engine with ``enforce_eager=True``) or positions are missing.
    NotImplementedError
        If more than one worker answers (tensor or pipeline parallel size above 1).
    """
    from vllm import SamplingParams

    llm = _llm(engine)
    info = _rpc(llm, START_METHOD, [int(i) for i in vocab_ids])
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=None)
    out: list[dict[str, Any]] = []
    try:
        for seq in sequences:
            seq = [int(t) for t in seq]
            prompt: dict[str, Any] = {"prompt_token_ids": seq}
            if not use_cache:
                prompt["cache_salt"] = f"rlparity-layers-{uuid.uuid4().hex}"
            res = llm.generate([prompt], params, use_tqdm=False)
            got = _rpc(llm, TAKE_METHOD)
            cached = int(getattr(res[0], "num_cached_tokens", 0) or 0)
            out.append(_assemble(got, seq, cached, info))
    finally:
        _rpc(llm, STOP_METHOD)
    return out


def _assemble(got: dict[str, Any], seq: list[int], cached: int, info: dict[str, Any]) -> dict[str, Any]:
    """One sequence's rows from the hooks' calls: the rows whose positions run ``cached, ..., L-1``
    (padding rows a runner may add are dropped); every id checked against the sequence."""
    if not got.get("n_complete"):
        raise RuntimeError(
            f"the layer hooks did not fire ({got.get('n_calls', 0)} forward calls seen): the engine runs a compiled "
            "model (torch.compile or CUDA graphs) that bypasses module hooks; start it with enforce_eager=True "
            "(EngineSettings(enforce_eager=True)) for a layer capture")
    pos, ids = unpack(got["positions"]), unpack(got["ids"])
    L = len(seq)
    want = np.arange(cached, L)
    # the real rows: each position's first occurrence (a chunked prefill runs the positions in order
    # over several calls; padding rows a runner appends come after the real ones)
    rows = np.full(L, -1, dtype=np.int64)
    for r, p in enumerate(pos.tolist()):
        if 0 <= p < L and rows[p] < 0 and (ids[r] < 0 or ids[r] == seq[p]):
            rows[p] = r
    missing = [int(p) for p in want if rows[p] < 0]
    if missing:
        raise RuntimeError(f"the layer capture saw no state for positions {missing[:8]} of a {L}-token sequence "
                           f"({cached} cached): the prefill did not run as one request")
    take = rows[want]
    states = np.stack([from_bits(got["dtype"], s)[take] for s in got["states"]])
    return {"states": states, "logits": unpack(got["logits"]).astype(np.float32)[take], "positions": want,
            "cached": cached, "length": L, "dtype": got["dtype"], "n_layers": info["n_layers"],
            "payload_bytes": int(sum(len(s["data"]) for s in got["states"])),
            "device_peak_extra_bytes": int(got.get("device_peak_extra_bytes", 0))}


def live_checksums(engine: Any) -> dict[str, Any]:
    """Per-tensor checksums of the weights the engine runs now (Hugging Face names), read in the worker.

    Parameters
    ----------
    engine : Engine or vllm.LLM
        An rlparity offline :class:`~rlparity.capture.Engine` or a ``vllm.LLM`` with rlparity's
        worker extension.

    Returns
    -------
    dict
        ``{"checksums", "probed", "unmapped", "seconds"}`` (see
        :meth:`LayerCaptureExtension.rlparity_weight_checksums`).

    Raises
    ------
    TypeError
        If ``engine`` is neither an rlparity Engine nor a ``vllm.LLM``.
    RuntimeError
        If the workers cannot run the method.
    NotImplementedError
        If more than one worker answers.
    """
    return _rpc(_llm(engine), CHECKSUM_METHOD)


__all__ = ["CHECKSUM_METHOD", "LayerCaptureExtension", "START_METHOD", "STOP_METHOD", "TAKE_METHOD", "capture_layers",
           "from_bits", "live_checksums", "unpack", "live_weight_checksums"]
