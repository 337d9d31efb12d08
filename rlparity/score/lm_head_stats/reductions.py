"""The full-vocabulary reductions of the fast path: the fused sums of a chunk (compiled where it
pays), the row maxima and the window of the largest logits read block by block."""

from __future__ import annotations

import warnings
from typing import Any

COMPILE_MIN_VOCAB = 32768  # on CPU, compile the full-vocabulary reduction from this vocabulary size


def _vocab_sums(logits, m, tok_logit, temp):
    """Full-vocabulary sums of one chunk given its row maxima ``m`` ``(N, 1)``, written to fuse
    into one pass over the logits when compiled.

    Returns ``s1 = sum exp(l - m)``, ``u1 = sum exp(l - m) (l - m)``, the same two sums ``sT``,
    ``uT`` of ``x - max x`` with ``x = l / t``, and the rank ``#{l > l_token}``. The sums
    accumulate in float64 (the terms are float32, as the reference's).
    """
    import torch

    z = logits - m
    e = z.exp()
    zt = logits / temp - m / temp
    et = zt.exp()
    rank = (logits > tok_logit).sum(dim=1)
    f64 = torch.float64
    return (e.sum(dim=1, dtype=f64), (e * z).sum(dim=1, dtype=f64),
            et.sum(dim=1, dtype=f64), (et * zt).sum(dim=1, dtype=f64), rank)


def _vocab_sums_eager(logits, m, tok_logit, temp, need_t: bool):
    """:func:`_vocab_sums` with two chunk-sized temporaries (in-place); skips the temperature
    sums when no row needs them (``need_t`` False: they equal the plain ones). The sums are
    torch's float32 cascade sums (about 1e-7 relative; a float64 sum is many times slower on
    CPU), returned as float64."""
    import torch

    rank = (logits > tok_logit).sum(dim=1)
    z = torch.sub(logits, m)
    e = torch.exp(z)
    s1 = e.sum(dim=1).double()
    u1 = e.mul_(z).sum(dim=1).double()
    if not need_t:
        return s1, u1, s1, u1, rank
    torch.div(logits, temp, out=z)
    z.sub_(m / temp)
    torch.exp(z, out=e)
    st = e.sum(dim=1).double()
    ut = e.mul_(z).sum(dim=1).double()
    return s1, u1, st, ut, rank


_COMPILED: dict[str, Any] = {}


def _compiled(fn):
    """``torch.compile(fn)`` once per process (dynamic shapes); ``fn`` itself where compiling failed."""
    import torch

    got = _COMPILED.get(fn.__name__)
    if got is None:
        got = _COMPILED[fn.__name__] = torch.compile(fn, dynamic=True)
    return got


def _call(fn, *args, compile: bool):
    """``fn(*args)``, through :func:`_compiled` when ``compile``; falls back to eager (with a
    warning, once) if the compiler is missing or fails: the maths are the same."""
    if not compile:
        return fn(*args)
    c = _compiled(fn)
    if c is fn:
        return fn(*args)
    try:
        return c(*args)
    except Exception as err:  # noqa: BLE001 - e.g. no C compiler or no triton: eager is the same maths
        warnings.warn(f"torch.compile of {fn.__name__} failed ({type(err).__name__}: {err}); using eager",
                      RuntimeWarning, stacklevel=3)
        _COMPILED[fn.__name__] = fn
        return fn(*args)


def block_size(vocab: int) -> int:
    """Columns per block for :func:`row_max_and_window`.

    Parameters
    ----------
    vocab : int
        The vocabulary size (columns of the logits).

    Returns
    -------
    int
        The largest power of two up to 128 that divides ``vocab``; 0 when that is below 16 (no
        blocks).
    """
    size = 128
    while size >= 16:
        if vocab % size == 0:
            return size
        size //= 2
    return 0


def row_max_and_window(logits, width: int | None):
    """Row maxima of ``logits`` and, if ``width``, the ``width`` largest entries of each row.

    With blocks (see :func:`block_size`) the rows are cut into blocks; the ``width`` blocks with
    the largest maxima hold the ``width`` largest values (any value outside them is at most the
    smallest of those maxima, and each of those blocks holds a value at least that large), so one
    ``topk`` over those blocks' columns gives exactly the values ``topk`` over the whole row gives
    (ties may pick other columns of the same value). That ``topk`` reads ``width`` blocks instead
    of the vocabulary: the costliest step of the head at a 150k vocabulary becomes small.

    Parameters
    ----------
    logits : torch.Tensor
        ``(N, V)`` logits.
    width : int or None
        How many of the largest entries to return per row; None or 0: only the maxima.

    Returns
    -------
    max : torch.Tensor
        ``(N, 1)`` row maxima.
    values : torch.Tensor or None
        ``(N, width)`` the largest entries, largest first (None without ``width``).
    indices : torch.Tensor or None
        ``(N, width)`` their column indices (None without ``width``).
    """
    n, vocab = logits.shape
    size = block_size(vocab)
    if not size:
        m = logits.amax(dim=1, keepdim=True)
        return (m, *logits.topk(min(width, vocab), dim=1)) if width else (m, None, None)
    blocks = logits.view(n, vocab // size, size)
    bmax = blocks.amax(dim=2)
    m = bmax.amax(dim=1, keepdim=True)
    if not width:
        return m, None, None
    width = min(width, vocab)
    nb = min(width, bmax.shape[1])
    top_b = bmax.topk(nb, dim=1).indices  # (N, nb) blocks
    cand = blocks.gather(1, top_b.unsqueeze(2).expand(-1, -1, size)).reshape(n, nb * size)
    vals, j = cand.topk(width, dim=1)
    idx = top_b.gather(1, j // size) * size + j % size
    return m, vals, idx


__all__ = ["COMPILE_MIN_VOCAB", "block_size", "row_max_and_window"]
