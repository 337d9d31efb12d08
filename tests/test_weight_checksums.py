"""Weight checksums (``rlparity.trace.weights.tensor_checksum``) against an independent reference:
``zlib.crc32`` of the bf16 values' int16 bytes, the float32 -> bf16 rounding (round to nearest, ties to
even) done by hand in numpy, ``-0.0`` counted as ``+0.0``; below, at and across the chunk size
(``CHECKSUM_CHUNK_VALUES`` made small, and at its real size), strided samples whose values straddle chunk
boundaries, infinities and NaN in any chunk (the last one alone included)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rlparity.trace import weights  # noqa: E402
from rlparity.trace.weights import NOT_FINITE, checksums, tensor_checksum  # noqa: E402

SMALL_CHUNK = 8


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values (NaN excluded) -> bfloat16 bit patterns (uint16), rounded to nearest, ties to even."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def reference(bits: np.ndarray) -> str:
    """The checksum of bf16 bit patterns (flattened, in order): -0.0 made +0.0, zlib's CRC-32 of their bytes,
    :data:`NOT_FINITE` first when one is an infinity (exponent bits all set)."""
    bits = np.where(bits.reshape(-1) == 0x8000, np.uint16(0), bits.reshape(-1))
    crc = f"{zlib.crc32(bits.astype('<u2').tobytes()) & 0xFFFFFFFF:08x}"
    return crc if not ((bits & 0x7F80) == 0x7F80).any() else NOT_FINITE + crc


def bf16_tensor(bits: np.ndarray):
    """A bfloat16 tensor holding exactly ``bits`` (made without torch's rounding)."""
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16)


def random_float32(n: int, rng) -> np.ndarray:
    """Normal values, exact ties of the bf16 rounding (low half 0x8000, both parities), -0.0, float32
    subnormals (a tiny negative one rounds to -0.0 in bf16) and a value that rounds up to infinity excluded."""
    x = rng.standard_normal(n).astype(np.float32)
    u = x.view(np.uint32)
    u[::5] = (u[::5] & 0xFFFF0000) | 0x8000  # exact ties: even rounds down, odd up
    x[3::11] = -0.0
    x[7::13] = np.float32(-1e-45)
    x[9::17] = np.float32(3e-39)
    return x


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(weights, "CHECKSUM_CHUNK_VALUES", SMALL_CHUNK)


@pytest.mark.parametrize("n", [0, 1, SMALL_CHUNK - 1, SMALL_CHUNK, SMALL_CHUNK + 1, 2 * SMALL_CHUNK, 5 * SMALL_CHUNK + 3])
def test_float32_and_bf16_checksums_equal_zlib_of_the_hand_rounded_values_at_every_chunking(n, small_chunks):
    rng = np.random.default_rng(n)
    x = random_float32(n, rng)
    bits = bf16_bits(x)
    assert (bits == 0x8000).any() or n < 8  # the -0.0 normalisation is exercised
    t32 = torch.from_numpy(x.copy())
    assert tensor_checksum(t32) == reference(bits)
    assert tensor_checksum(t32.reshape(-1, 1) if n else t32) == reference(bits)
    raw = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    raw = np.where((raw & 0x7F80) == 0x7F80, raw & 0x807F, raw)  # no infinity or NaN
    raw[::4] = 0x8000  # -0.0 held by the caller's bf16 tensor
    tb = bf16_tensor(raw)
    before = tb.view(torch.int16).clone()
    assert tensor_checksum(tb) == reference(raw)
    assert torch.equal(tb.view(torch.int16), before)  # the caller's -0.0 untouched (the chunk was copied)


def test_a_matrix_and_a_transposed_one_are_checksummed_in_their_row_major_order(small_chunks):
    x = random_float32(6 * 7, np.random.default_rng(1)).reshape(6, 7)
    t = torch.from_numpy(x.copy())
    assert tensor_checksum(t) == reference(bf16_bits(x))
    assert tensor_checksum(t.t()) == reference(bf16_bits(x.T))
    assert tensor_checksum(t[:, 2:5]) == reference(bf16_bits(x[:, 2:5]))


@pytest.mark.parametrize("stride,offset", [(2, 0), (3, 1), (3, 5), (7, 6), (SMALL_CHUNK, 3), (SMALL_CHUNK + 1, 2),
                                           (61, 60)])
def test_strided_samples_with_offsets_across_chunk_boundaries(stride, offset, small_chunks):
    n = 23 * SMALL_CHUNK + 5  # the sample spans several chunks, its last one partial
    x = random_float32(n, np.random.default_rng(stride * 100 + offset))
    want = reference(bf16_bits(x[offset % stride::stride]))
    assert tensor_checksum(torch.from_numpy(x.copy()), stride=stride, offset=offset) == want
    assert tensor_checksum(torch.from_numpy(x.copy()).reshape(n, 1), stride=stride, offset=offset) == want
    raw = bf16_bits(x)
    assert tensor_checksum(bf16_tensor(raw), stride=stride, offset=offset) == reference(raw[offset % stride::stride])
    assert tensor_checksum(bf16_tensor(raw), stride=stride) == reference(raw[::stride])  # offset 0 by default
    # an infinity outside the sample is not seen, one inside it is
    x[offset % stride + 1] = np.inf  # right after the first sampled value
    if stride > 1:
        assert tensor_checksum(torch.from_numpy(x.copy()), stride=stride, offset=offset) == want
    x[offset % stride + stride * (len(x[offset % stride::stride]) - 1)] = -np.inf  # the sample's last value
    got = tensor_checksum(torch.from_numpy(x.copy()), stride=stride, offset=offset)
    assert got == reference(bf16_bits(x[offset % stride::stride])) and got.startswith(NOT_FINITE)


@pytest.mark.parametrize("where", [0, SMALL_CHUNK - 1, SMALL_CHUNK, 2 * SMALL_CHUNK + 3, 4 * SMALL_CHUNK,
                                   4 * SMALL_CHUNK + 2])
def test_infinities_and_nan_in_any_chunk_the_last_alone_included(where, small_chunks):
    n = 4 * SMALL_CHUNK + 3  # chunks 0..3 whole, chunk 4 holds 3 values: 4 * SMALL_CHUNK and up
    x = random_float32(n, np.random.default_rng(where))
    assert not tensor_checksum(torch.from_numpy(x.copy())).startswith(NOT_FINITE)
    for bad in (np.inf, -np.inf, np.float32(3.4e38)):  # the last rounds up to infinity in bf16
        y = x.copy()
        y[where] = bad
        got = tensor_checksum(torch.from_numpy(y))
        assert got == reference(bf16_bits(y)) and got.startswith(NOT_FINITE), (bad, got)
        raw = bf16_bits(y)
        assert tensor_checksum(bf16_tensor(raw)) == reference(raw)
    for nan_dtype in (torch.float32, torch.bfloat16):
        y = torch.from_numpy(x.copy()).to(nan_dtype)
        y[where] = float("nan")
        got = tensor_checksum(y)
        # NaN's bf16 bits are torch's (0x7FC0 or 0xFFFF by where the vectorised conversion put it): no reference
        # for the digits; the prefix is the contract (never equal to anything)
        assert got.startswith(NOT_FINITE) and len(got) == len(NOT_FINITE) + 8, got
        int(got[len(NOT_FINITE):], 16)


def test_at_and_across_the_real_chunk_size():
    chunk = weights.CHECKSUM_CHUNK_VALUES
    assert chunk >= 1 << 16  # a chunk is large beside its per-chunk overhead (see its comment)
    rng = np.random.default_rng(7)
    x = random_float32(chunk + 3, rng)
    assert tensor_checksum(torch.from_numpy(x[:chunk].copy())) == reference(bf16_bits(x[:chunk]))
    y = x.copy()
    y[-1] = np.inf  # only in the last chunk (3 values)
    got = tensor_checksum(torch.from_numpy(y))
    assert got == reference(bf16_bits(y)) and got.startswith(NOT_FINITE)
    raw = bf16_bits(x)
    assert tensor_checksum(bf16_tensor(raw), stride=3, offset=2) == reference(raw[2::3])


def test_checksums_of_many_tensors_in_threads_equal_the_reference_in_the_callers_order(small_chunks):
    rng = np.random.default_rng(3)
    arrays = [random_float32(int(n), rng) for n in rng.integers(0, 5 * SMALL_CHUNK, 12)]
    named = [(f"layers.{len(arrays) - i}.w", torch.from_numpy(a.copy())) for i, a in enumerate(arrays)]
    got = checksums(named)
    assert list(got) == [n for n, _ in named]
    assert got == {n: reference(bf16_bits(a)) for (n, _), a in zip(named, arrays)}


def test_integer_tensors_are_the_crc_of_their_own_bytes():
    a = np.arange(-20, 20, dtype=np.int64)
    assert tensor_checksum(torch.from_numpy(a.copy())) == f"{zlib.crc32(a.tobytes()) & 0xFFFFFFFF:08x}"
    assert tensor_checksum(torch.from_numpy(a.copy()), stride=3, offset=1) == \
        f"{zlib.crc32(a[1::3].tobytes()) & 0xFFFFFFFF:08x}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("chunk", [SMALL_CHUNK, None])
def test_cuda_tensors_through_pinned_chunks_give_the_reference(chunk, monkeypatch):
    if chunk:
        monkeypatch.setattr(weights, "CHECKSUM_CHUNK_VALUES", chunk)
    n = 3 * weights.CHECKSUM_CHUNK_VALUES + 5
    x = random_float32(n, np.random.default_rng(11))
    raw = bf16_bits(x)
    assert tensor_checksum(torch.from_numpy(x.copy()).cuda()) == reference(raw)
    tb = bf16_tensor(raw).cuda()
    assert tensor_checksum(tb) == reference(raw) and bool((tb.view(torch.int16) == -32768).any())
    assert tensor_checksum(tb, stride=5, offset=3) == reference(raw[3::5])
    y = x.copy()
    y[-1] = -np.inf
    assert tensor_checksum(torch.from_numpy(y).cuda()) == reference(bf16_bits(y))
    named = [(f"w{i}", torch.from_numpy(random_float32(n - i, np.random.default_rng(i))).cuda()) for i in range(6)]
    assert checksums(named) == {name: reference(bf16_bits(t.cpu().numpy())) for name, t in named}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_checksums_on_a_side_stream_see_the_writes_queued_before_it():
    """Issue 39: the Scorer checksums a model on a CUDA stream of its own, beside the scoring, ordered after what
    the current stream had queued (an optimizer step): the values it reads are the written ones, although the
    write was still queued behind a long kernel when the checksums started."""
    n = 1 << 20
    t = torch.zeros(n, device="cuda")
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):  # keep the current stream busy for a while
        big = big @ big / 64.0
    t.add_(1.5)  # queued behind them
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    got = checksums([("t", t), ("u", t[: n // 2])], stream=side)
    torch.cuda.synchronize()
    want = reference(bf16_bits(np.full(n, 1.5, dtype=np.float32)))
    assert got == {"t": want, "u": reference(bf16_bits(np.full(n // 2, 1.5, dtype=np.float32)))}
