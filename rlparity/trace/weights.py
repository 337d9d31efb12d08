"""Weight fingerprints: per-tensor checksums both sides record, so a trace can say whether the
engine and the trainer held the same weights for each policy version.

A checksum is the CRC-32 of a tensor rounded to bfloat16 (hex, 8 digits), keyed by its checkpoint
name (``model.layers.0.self_attn.q_proj.weight``). Rounding first makes a float32 copy and a
bfloat16 copy of the same weights agree (engines and trainers often load one checkpoint in
different dtypes), while any real change of the weights (an update, a perturbation of 1e-3
relative or more) changes the bfloat16 values and so the checksum.

The engine records the checksums of the checkpoint it loaded per version
(``attrs["engine_weight_checksums"]``), the trainer those of the weights it scored each version
with (``attrs["trainer"]["weight_checksums"]``); :func:`compare_checksums` says which tensors
differ. torch is imported inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rlparity.trace.record import arm_record

try:  # ISA-L's CRC-32: bit-identical to zlib.crc32, about 7x faster; zlib's where isal is not installed
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; a bare GPU image may lack it
    from zlib import crc32

# the checksum prefix of a tensor with NaN or infinite values: never equal to anything
NOT_FINITE = "not-finite:"
# above this many bytes of checkpoint, fingerprints are skipped (reading them would cost seconds)
MAX_FINGERPRINT_BYTES = 4 << 30
# tensors checksummed at once by :func:`checksums` (each thread holds one chunk's bf16 copy on the CPU)
FINGERPRINT_THREADS = 4
# values rounded, copied to the CPU and CRC'd at a time (a running CRC over the chunks): 4M values, 8 MiB of
# bf16 per thread instead of a copy of the whole tensor (an LM head of a 7B model: 1 GiB), small enough that
# one thread's copy overlaps another's CRC, large enough that the per-chunk kernel launches and the wait for
# the copy cost nothing beside the bytes (8 MiB: ~0.3 ms of CRC, ~0.4 ms of PCIe)
CHECKSUM_CHUNK_VALUES = 1 << 22


def tensor_checksum(tensor: Any, *, stride: int = 1, offset: int = 0) -> str:
    """CRC-32 (hex) of ``tensor`` rounded to bfloat16; or of a strided sample of its values.

    Integer tensors are checksummed as they are. ``-0.0`` counts as ``+0.0`` (the same weight); a
    tensor holding NaN or an infinity gets a checksum starting with :data:`NOT_FINITE`, which
    :func:`compare_checksums` never counts as equal (NaN weights are no evidence that two sides agree).

    One pass of copies, chunk by chunk (:data:`CHECKSUM_CHUNK_VALUES` values at a time, a running CRC over
    the chunks, so only one chunk's copy is held): the bf16 copy is made on the tensor's own device and
    zeros are normalised in it, the finiteness check is one min/max reduction there (``torch.isfinite``
    over the whole tensor cost four times the rest on a CPU), and only the bf16 values are copied to the
    CPU (from a GPU into pinned memory), where ISA-L's CRC-32 (zlib's values) reads their buffer in place.

    Parameters
    ----------
    tensor : torch.Tensor
        The tensor.
    stride : int, default 1
        Checksum every ``stride``-th value of the flattened tensor only (1: every value): a sample
        that sees a change only where a sampled value changed (and NaN only where one is NaN).
    offset : int, default 0
        The first value sampled (taken modulo ``stride``).

    Returns
    -------
    str
        8 hex digits (after :data:`NOT_FINITE` for a tensor with NaN or infinite values).
    """
    if stride < 1:
        raise ValueError(f"stride={stride}: checksum every value (1) or every stride-th (> 1)")
    t = tensor.detach()
    if stride > 1:
        t = t.reshape(-1)[offset % stride::stride]
    if not t.is_floating_point():
        return f"{crc32(t.to('cpu').contiguous().numpy()) & 0xFFFFFFFF:08x}"
    flat = t.reshape(-1)  # the values in the tensor's own (row-major) order; a view unless t is not contiguous
    crc, finite = 0, True
    for start in range(0, flat.numel(), CHECKSUM_CHUNK_VALUES):
        crc, ok = _chunk_checksum(flat[start:start + CHECKSUM_CHUNK_VALUES], crc)
        finite = finite and ok
    digits = f"{crc & 0xFFFFFFFF:08x}"
    return digits if finite else NOT_FINITE + digits


def _chunk_checksum(chunk: Any, crc: int) -> tuple[int, bool]:
    """(the running CRC-32 ``crc`` continued over ``chunk``'s bf16 values, whether they are all finite).

    Rounding, the sign of zeros and the finiteness check run where the chunk is (a GPU does them in
    microseconds); only its bf16 values travel to the CPU, where the CRC reads their buffer in place.
    """
    import torch

    b = chunk.to(torch.bfloat16)
    if b.untyped_storage().data_ptr() == chunk.untyped_storage().data_ptr():  # no copy made: never change the caller's
        b = b + 0.0  # -0.0 + 0.0 is +0.0: the sign of a zero is not a different weight
    else:
        b.add_(0.0)
    lo, hi = torch.aminmax(b)  # NaN propagates through min and max; an infinity is one of them
    if b.is_cuda:  # into pinned host memory (torch's caching host allocator reuses it), waited for on its stream
        host = torch.empty(b.shape, dtype=torch.bfloat16, pin_memory=True)
        host.copy_(b, non_blocking=True)
        torch.cuda.current_stream(b.device).synchronize()
    else:
        host = b.to("cpu").contiguous()
    finite = bool(torch.isfinite(lo) & torch.isfinite(hi))
    return crc32(host.view(torch.int16).numpy(), crc), finite


def checksums(named_tensors: Iterable[tuple[str, Any]], *, stream: Any = None) -> dict[str, str]:
    """``{name: checksum}`` of named tensors.

    Parameters
    ----------
    named_tensors : iterable of tuple[str, torch.Tensor]
        A state dict's ``items()``, a checkpoint iterator.
    stream : torch.cuda.Stream, optional
        The CUDA stream every copy and reduction of a GPU tensor runs on (in every worker thread; the
        caller orders it after the writes it must see, e.g. ``stream.wait_stream(current_stream)``);
        None: each thread's current stream.

    Returns
    -------
    dict[str, str]
        :func:`tensor_checksum` per name.
    """
    from concurrent.futures import ThreadPoolExecutor

    def one(t: Any) -> str:
        if stream is None:
            return tensor_checksum(t)
        import torch

        with torch.cuda.stream(stream):  # a stream context is per thread: set in each worker
            return tensor_checksum(t)

    items = [(str(name), t) for name, t in named_tensors]
    if len(items) < 2:
        return {name: one(t) for name, t in items}
    # the copy to the CPU and zlib's CRC release the GIL: a few tensors at a time (each holds one bf16 copy)
    with ThreadPoolExecutor(max_workers=min(FINGERPRINT_THREADS, len(items))) as pool:
        sums = list(pool.map(one, (t for _, t in items)))
    return dict(zip((name for name, _ in items), sums))


def compare_checksums(engine: Mapping[str, str], trainer: Mapping[str, str]) -> dict[str, Any]:
    """How two fingerprints differ.

    Names present on one side only because weights are tied (``lm_head.weight`` absent from a
    checkpoint that ties it to the embeddings) are not reported when the other side has the tied
    partner.

    Parameters
    ----------
    engine : Mapping[str, str]
        The engine's checksums by tensor name.
    trainer : Mapping[str, str]
        The trainer's checksums by tensor name.

    Returns
    -------
    dict[str, Any]
        ``n_compared``, ``differ`` (tensors whose checksums differ), ``missing_in_engine`` (tensors
        the trainer has that the engine's record lacks: not loaded, a partial update),
        ``only_in_engine``, ``not_finite`` (common tensors holding NaN or infinities on either side:
        not comparable, so never equal) and ``equal`` (nothing differs, is missing or is not finite).
    """
    common = sorted(set(engine) & set(trainer))
    not_finite = [n for n in common if str(engine[n]).startswith(NOT_FINITE) or str(trainer[n]).startswith(NOT_FINITE)]
    differ = [n for n in common if engine[n] != trainer[n] and n not in not_finite]
    tied = {"lm_head.weight", "model.embed_tokens.weight"}
    missing = sorted(n for n in set(trainer) - set(engine) if not (n in tied and tied & set(engine)))
    extra = sorted(n for n in set(engine) - set(trainer) if not (n in tied and tied & set(trainer)))
    return {"n_compared": len(common), "differ": differ, "missing_in_engine": missing, "only_in_engine": extra,
            "not_finite": not_finite, "equal": not differ and not missing and not not_finite}


def tensors_not_equal(cmp: Mapping[str, Any]) -> list[str]:
    """The tensors a comparison cannot call equal: they differ, are missing in the engine, or hold
    NaN or infinities (a record written before ``not_finite`` existed has none).

    Parameters
    ----------
    cmp : Mapping[str, Any]
        A :func:`compare_checksums` result.

    Returns
    -------
    list of str
        The names, sorted.
    """
    return sorted(set(cmp["differ"]) | set(cmp["missing_in_engine"]) | set(cmp.get("not_finite", ())))


def layers_of(names: Iterable[str]) -> list[int]:
    """Decoder layer indices named in checkpoint names (``...layers.<i>....``), sorted, unique.

    Parameters
    ----------
    names : iterable of str
        Checkpoint tensor names.

    Returns
    -------
    list[int]
        The layer indices.
    """
    import re

    out = set()
    for n in names:
        m = re.search(r"\.layers\.(\d+)\.", n)
        if m:
            out.add(int(m.group(1)))
    return sorted(out)


def engine_effective(attrs: Mapping[str, Any]) -> dict[int, dict[str, str]]:
    """Per version, the checksums of the weights an engine ran.

    From a trace's ``attrs["engine_weight_checksums"]``: every load up to that version in order,
    since a load that leaves tensors out keeps the older values.

    Parameters
    ----------
    attrs : Mapping[str, Any]
        A trace's attrs.

    Returns
    -------
    dict[int, dict[str, str]]
        ``{version: {tensor: checksum}}``.
    """
    loads = {int(k): v for k, v in (arm_record(attrs).engine_weight_checksums or {}).items() if v}
    out, cur = {}, {}
    for v in sorted(loads):
        cur = {**cur, **loads[v]}
        out[v] = dict(cur)
    return out


def trainer_checksums(attrs: Mapping[str, Any], versions: list[int]) -> dict[int, dict[str, str]]:
    """Per version, the checksums of the weights the trainer scored it with.

    From a trace's ``attrs["trainer"]``; one fingerprint covers every version of a trace scored with
    one set of weights only when the trace holds one version.

    Parameters
    ----------
    attrs : Mapping[str, Any]
        A trace's attrs.
    versions : list of int
        The trace's policy versions.

    Returns
    -------
    dict[int, dict[str, str]]
        ``{version: {tensor: checksum}}``; empty where the trainer recorded none.
    """
    t = arm_record(attrs).scorer
    if t.weight_checksums_per_version:
        return {int(k): v for k, v in t.weight_checksums_per_version.items() if v}
    if t.weight_checksums and len(versions) == 1:
        return {versions[0]: t.weight_checksums}
    return {}


def versions_that_differ(attrs: Mapping[str, Any], versions: list[int]) -> dict[int, dict[str, Any]]:
    """The versions whose engine and trainer fingerprints differ.

    Parameters
    ----------
    attrs : Mapping[str, Any]
        A trace's attrs.
    versions : list of int
        The trace's policy versions.

    Returns
    -------
    dict[int, dict[str, Any]]
        Per differing version, :func:`compare_checksums`'s answer and ``same_as`` (the engine versions
        whose weights equal the trainer's for it: a trainer that scored with another version's
        weights).
    """
    engine, trainer = engine_effective(attrs), trainer_checksums(attrs, versions)
    out = {}
    for v in versions:
        if v in engine and v in trainer:
            cmp = compare_checksums(engine[v], trainer[v])
            if not cmp["equal"]:
                cmp["same_as"] = [u for u, e in engine.items() if u != v and compare_checksums(e, trainer[v])["equal"]]
                out[v] = cmp
    return out


__all__ = ["MAX_FINGERPRINT_BYTES", "NOT_FINITE", "checksums", "compare_checksums", "engine_effective", "layers_of",
           "tensor_checksum", "tensors_not_equal", "trainer_checksums", "versions_that_differ"]
