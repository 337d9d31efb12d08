"""The engine's weight digest a run store records per sync: per-tensor CRC-32 checksums of the
bf16-rounded values (:func:`rlparity.trace.weights.tensor_checksum`), of every tensor or a sample, of
every value or a strided sample, as integers."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rlparity.trace.weights import NOT_FINITE, tensor_checksum


class WeightDigest(dict):
    """``{tensor name: CRC-32}`` as :func:`weight_digest` returns it, with the ``stride`` its values
    were sampled at (1: every value), which :meth:`Recorder.step <rlparity.record.recorder.Recorder.step>` records beside it.

    Parameters
    ----------
    values : Mapping[str, int]
        The checksums.
    stride : int, default 1
        Every ``stride``-th value of each tensor was checksummed.
    """

    def __init__(self, values: Mapping[str, int], stride: int = 1):
        super().__init__(values)
        self.stride = int(stride)


def digest_value(checksum: str) -> int:
    """A :func:`~rlparity.trace.weights.tensor_checksum` as the integer a run store holds.

    Parameters
    ----------
    checksum : str
        8 hex digits, after :data:`~rlparity.trace.weights.NOT_FINITE` for a tensor with NaN or
        infinite values.

    Returns
    -------
    int
        The CRC-32, plus ``2**32`` for a tensor with NaN or infinite values (never equal to a finite
        tensor's).
    """
    if checksum.startswith(NOT_FINITE):
        return int(checksum[len(NOT_FINITE):], 16) + (1 << 32)
    return int(checksum, 16)


def sample_offset(name: str, stride: int) -> int:
    """The first value :func:`weight_digest` samples of tensor ``name`` at ``stride``: fixed per name
    (the same values at every sync) and spread over names, so a stride that divides a row length
    does not sample the same column of every matrix.

    Parameters
    ----------
    name : str
        The tensor's name.
    stride : int
        Every ``stride``-th value is sampled.

    Returns
    -------
    int
        In ``[0, stride)``; 0 for ``stride`` 1.
    """
    return zlib.crc32(name.encode()) % stride if stride > 1 else 0


def weight_digest(named_tensors: Iterable[tuple[str, Any]], *, sample: int | None = None,
                  stride: int = 1) -> WeightDigest:
    """Per-tensor checksums of weights, as ``rlparity verify-weights`` computes them (CRC-32 of the
    bf16-rounded values, :func:`rlparity.trace.weights.tensor_checksum`), of every tensor or a sample
    of tensors, of every value or a strided sample of values.

    The samples are the same at every call (tensors evenly spaced over the sorted names; in each
    tensor every ``stride``-th value from :func:`sample_offset`), so two syncs' digests compare.
    With ``stride > 1`` a sync is seen to change a tensor only where a sampled value changed: an
    update that moves a handful of bf16 values (a float32 trainer's tiny step) most likely reads as
    no change at all.

    Parameters
    ----------
    named_tensors : iterable of tuple[str, torch.Tensor]
        ``model.named_parameters()``, a state dict's ``items()``, the engine's weights.
    sample : int, optional
        Checksum only this many tensors; ``None`` checksums every one.
    stride : int, default 1
        Checksum every ``stride``-th value of each tensor (1: every value, the checksums
        ``verify-weights`` prints).

    Returns
    -------
    WeightDigest
        ``{name: CRC-32}`` (:func:`digest_value`), ``.stride`` set.
    """
    if int(stride) < 1:
        raise ValueError(f"stride={stride}: checksum every value (1) or every stride-th value (> 1)")
    items = sorted(((str(n), t) for n, t in named_tensors), key=lambda x: x[0])
    if sample is not None and 0 < sample < len(items):
        idx = np.unique(np.linspace(0, len(items) - 1, int(sample)).round().astype(int))
        items = [items[i] for i in idx]
    k = int(stride)
    return WeightDigest({n: digest_value(tensor_checksum(t, stride=k, offset=sample_offset(n, k))) for n, t in items},
                        stride=k)


__all__ = ["WeightDigest", "digest_value", "sample_offset", "weight_digest"]
