"""The trainer's LM-head statistics per response token (torch and numpy only).

:func:`head_stats` projects hidden states through the LM head in chunks of rows and returns, per
row (token), in nats:

* ``trainer_logprob``: log-softmax of the sampled token over the full vocabulary, temperature 1
  (vLLM's ``raw_logprobs``);
* ``trainer_processed_logprob``: the same token under vLLM's sampler distribution (temperature,
  then top-k with ties at the boundary kept, then top-p, renormalised; ``-inf`` when the token is
  outside the kept set; greedy rows read the full-vocabulary log-softmax);
* ``trainer_entropy`` / ``trainer_processed_entropy``: entropies of both distributions;
* ``trainer_max_logit``, ``trainer_token_rank`` (tokens with a strictly larger logit) and
  ``trainer_log_kept_mass`` (log of the probability mass, at the temperature, that top-k / top-p
  keep; 0 when nothing is cut).

How it stays at the speed of a bare forward (issue 16):

* the full-vocabulary statistics come from one fused reduction per chunk (max, two sums of
  exponentials at temperature 1 and at the row's temperature, the rank count), compiled with
  ``torch.compile`` on CUDA, written with in-place operations elsewhere;
* the processed statistics come from one ``topk`` of the largest ``k`` plus a few more logits:
  the kept set, its log-sum-exp and its entropy are computed on those ``k`` values only. The extra
  candidates show whether ties at the k-th value continue past the window; such a row (and a
  top-p row without top-k, which needs the whole sorted row) takes the full-vocabulary reference
  path, so the kept set is always exactly vLLM's;
* on CUDA an fp32 head over a bf16 / fp16 body multiplies the 16-bit hidden states and weights
  (exact in fp32) with fp32 accumulation and fp32 output, without a float copy of the weight;
* every statistic stays on the device until one host copy per call.

:func:`head_stats_reference` is the straightforward implementation (several full-vocabulary
passes per statistic); the tests check that both agree, on the same logits, to 1e-5 nats with each
other and with an independent float64 computation. The logits can differ with ``fp32_gemm`` (see
:func:`project`).

This module imports nothing from rlparity, so a benchmark can load it on a machine that has only
torch and numpy.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

SAMPLING_EPS = 1e-5  # vLLM's threshold for greedy
COMPILE_MIN_VOCAB = 32768  # on CPU, compile the full-vocabulary reduction from this vocabulary size
TOPK_SLACK = 8  # candidates fetched past the largest k, to see whether ties at the k-th value go on
STATS = ("trainer_logprob", "trainer_processed_logprob", "trainer_entropy", "trainer_processed_entropy",
         "trainer_max_logit", "trainer_token_rank", "trainer_log_kept_mass", "trainer_cut_margin")


def _kth_largest(desc, k):
    """The k-th largest value of each row of ``desc`` (largest first, at least ``k`` values), ``(N, 1)``:
    vLLM's top-k keeps every value ``>=`` it (ties at the boundary survive)."""
    return desc.gather(1, (k - 1).unsqueeze(1))


def _top_p_cut(asc, top_p):
    """vLLM's top-p on each row of ``asc`` (smallest first; ``-inf`` for what top-k dropped): the
    entries cut, those whose float32 cumulative probability stays within ``1 - top_p``; never the
    largest."""
    cut = asc.softmax(dim=1).cumsum(dim=1) <= (1 - top_p).unsqueeze(1)
    cut[:, -1] = False
    return cut


def processed_logits(logits, temperature, top_k, top_p):
    """vLLM's sampler transform on float32 logits ``(N, V)``: temperature, top-k, top-p.

    Top-k keeps ties at the boundary (every logit equal to the k-th largest survives); top-p
    masks, in ascending order, the tokens whose cumulative probability is ``<= 1 - top_p`` and
    always keeps the most likely one. Greedy rows (temperature below ``SAMPLING_EPS``) are left
    unscaled and uncut.

    Parameters
    ----------
    logits : torch.Tensor
        ``(N, V)`` float32 logits.
    temperature : torch.Tensor
        ``(N,)`` per-row temperature.
    top_k : torch.Tensor
        ``(N,)`` per-row top-k; 0 (or >= V) = off.
    top_p : torch.Tensor
        ``(N,)`` per-row top-p; 1 = off.

    Returns
    -------
    torch.Tensor
        ``(N, V)`` the temperature-scaled logits with the cut entries ``-inf``.
    """
    import torch

    greedy = temperature < SAMPLING_EPS
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    out = logits / temp.unsqueeze(1)
    vocab = out.shape[1]
    k = top_k.clone()
    k[(k <= 0) | (k >= vocab) | greedy] = vocab
    if bool((k < vocab).any()):
        # the k-th largest per row; topk up to the largest k is much cheaper than a full sort
        kth = _kth_largest(out.topk(int(k.max()), dim=1).values, k)
        out = out.masked_fill(out < kth, float("-inf"))  # ties at the boundary survive
    p = torch.where(greedy, torch.ones_like(top_p), top_p)
    if bool((p < 1.0).any()):
        srt, idx = out.sort(dim=1, descending=False)
        srt = srt.masked_fill(_top_p_cut(srt, p), float("-inf"))
        out = torch.empty_like(out).scatter_(1, idx, srt)
    return out


def cut_margin(logits, proc, tok_logit):
    """Per row: the smallest logit the top-k/top-p cut keeps minus the sampled token's logit.

    Parameters
    ----------
    logits : torch.Tensor
        ``(N, V)`` raw logits.
    proc : torch.Tensor
        ``(N, V)`` the processed logits (:func:`processed_logits`), ``-inf`` where cut.
    tok_logit : torch.Tensor
        ``(N, 1)`` the sampled token's raw logit.

    Returns
    -------
    torch.Tensor
        ``(N,)`` margin in raw logit units: > 0 when the token is outside the kept set, <= 0 inside;
        NaN where nothing is cut.
    """
    import torch

    kept = torch.isfinite(proc)
    edge = torch.where(kept, logits, torch.full_like(logits, float("inf"))).min(dim=1).values
    margin = edge - tok_logit.squeeze(1)
    return torch.where(kept.all(dim=1), torch.full_like(margin, float("nan")), margin)


def _entropy(logp):
    import torch

    p = logp.exp()
    return -(torch.where(p > 0, p * logp, torch.zeros_like(p))).sum(dim=1)


def head_stats_reference(hidden, weight, bias, token_ids, temperature, top_k, top_p, head_dtype,
                         chunk_tokens: int = 512, fp32_gemm: str = "cast") -> dict[str, np.ndarray]:
    """The implementation of :func:`head_stats` before issue 16 (same arguments, same result).

    Every statistic comes from its own full-vocabulary pass, one host copy per statistic and
    chunk. Slow; kept for the equality tests and ``benchmarks/rescoring.py``.

    Parameters
    ----------
    hidden : torch.Tensor
        ``(N, H)`` last hidden states, one row per token.
    weight : torch.Tensor
        ``(V, H)`` LM-head weight.
    bias : torch.Tensor or None
        ``(V,)`` LM-head bias, or None.
    token_ids : torch.Tensor
        ``(N,)`` the sampled token of each row.
    temperature : torch.Tensor
        ``(N,)`` per-row temperature.
    top_k : torch.Tensor
        ``(N,)`` per-row top-k; 0 = off.
    top_p : torch.Tensor
        ``(N,)`` per-row top-p; 1 = off.
    head_dtype : str or torch.dtype
        Precision of the head projection.
    chunk_tokens : int, default 512
        Rows per chunk.
    fp32_gemm : str, default "cast"
        ``"cast"``: cast hidden states and weight to ``head_dtype`` and multiply; ``"auto"``:
        project as :func:`project` does (to compare the statistics on the same logits).

    Returns
    -------
    dict of str to numpy.ndarray
        One ``(N,)`` array per name of :data:`STATS` (logprobs and entropies in nats,
        ``trainer_token_rank`` int64).
    """
    import torch

    hd = getattr(torch, head_dtype) if isinstance(head_dtype, str) else head_dtype
    w = weight.to(hd) if fp32_gemm == "cast" else weight
    b = bias.to(hd) if bias is not None and fp32_gemm == "cast" else bias
    out: dict[str, list[np.ndarray]] = {k: [] for k in STATS}
    for s in range(0, hidden.shape[0], chunk_tokens):
        sl = slice(s, s + chunk_tokens)
        if fp32_gemm == "cast":
            logits = torch.nn.functional.linear(hidden[sl].to(hd), w, b).float()
        else:
            logits = project(hidden[sl], w, b, head_dtype, fp32_gemm)
        tok = token_ids[sl].unsqueeze(1)
        logp = logits.log_softmax(dim=1)
        proc = processed_logits(logits, temperature[sl], top_k[sl], top_p[sl])
        plogp = proc.log_softmax(dim=1)
        greedy = temperature[sl] < SAMPLING_EPS
        temp = torch.where(greedy, torch.ones_like(temperature[sl]), temperature[sl])
        kept = proc.logsumexp(dim=1) - (logits / temp.unsqueeze(1)).logsumexp(dim=1)
        tok_logit = logits.gather(1, tok)
        out["trainer_logprob"].append(logp.gather(1, tok).squeeze(1).double().cpu().numpy())
        out["trainer_processed_logprob"].append(plogp.gather(1, tok).squeeze(1).double().cpu().numpy())
        out["trainer_entropy"].append(_entropy(logp).double().cpu().numpy())
        out["trainer_processed_entropy"].append(_entropy(plogp).double().cpu().numpy())
        out["trainer_max_logit"].append(logits.max(dim=1).values.double().cpu().numpy())
        out["trainer_token_rank"].append((logits > tok_logit).sum(dim=1).cpu().numpy().astype(np.int64))
        out["trainer_log_kept_mass"].append(kept.clamp(max=0.0).double().cpu().numpy())
        out["trainer_cut_margin"].append(cut_margin(logits, proc, tok_logit).double().cpu().numpy())
    return {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in out.items()}


# -- the fast path ------------------------------------------------------------------------------
FP32_GEMMS = ("auto", "cast")


def project(hidden, weight, bias, head_dtype, fp32_gemm: str = "auto"):
    """LM-head logits ``(N, V)`` in float32, the head computed in ``head_dtype``.

    ``fp32_gemm="auto"``: a float32 head on CUDA over 16-bit hidden states and weights multiplies
    the 16-bit values (exact in float32) on the tensor cores with float32 accumulation and a
    float32 result, without a float32 copy of the weight. The result differs from cuBLAS's
    float32 GEMM only by the order of the float32 additions (about 3e-5 on logits of size 13,
    as far from the float64 product as that GEMM's own error; benchmarks/README.md). That is
    enough to move a token at an exact top-k tie (or at the top-p edge) in or out of the kept set:
    such a row's processed statistics then differ from the SGEMM's by up to about 1/k nats (2e-2
    seen on an H200); every other statistic stays within float32 rounding.
    ``"cast"`` (and any case "auto" does not cover) casts both to ``head_dtype`` first, as the
    reference and most trainers do.

    Parameters
    ----------
    hidden : torch.Tensor
        ``(N, H)`` hidden states.
    weight : torch.Tensor
        ``(V, H)`` LM-head weight.
    bias : torch.Tensor or None
        ``(V,)`` LM-head bias, or None.
    head_dtype : str or torch.dtype
        Precision of the head projection.
    fp32_gemm : {"auto", "cast"}, default "auto"
        How a float32 head multiplies 16-bit inputs (above).

    Returns
    -------
    torch.Tensor
        ``(N, V)`` float32 logits.

    Raises
    ------
    ValueError
        If ``fp32_gemm`` is not one of :data:`FP32_GEMMS`.
    """
    import torch

    if fp32_gemm not in FP32_GEMMS:
        raise ValueError(f"fp32_gemm={fp32_gemm!r}; use one of {FP32_GEMMS}")
    hd = getattr(torch, head_dtype) if isinstance(head_dtype, str) else head_dtype
    half = (torch.bfloat16, torch.float16)
    if (fp32_gemm == "auto" and hd == torch.float32 and hidden.is_cuda and hidden.dtype in half
            and weight.dtype == hidden.dtype and hidden.ndim == 2 and _mm_out_dtype()):
        logits = torch.mm(hidden, weight.t(), out_dtype=torch.float32)
        return logits.add_(bias.float()) if bias is not None else logits
    b = bias.to(hd) if bias is not None else None
    return torch.nn.functional.linear(hidden.to(hd), weight.to(hd), b).float()


_MM_OUT_DTYPE: bool | None = None


def _mm_out_dtype() -> bool:
    """Whether this torch multiplies 16-bit matrices into a float32 result (``mm(out_dtype=)``)."""
    global _MM_OUT_DTYPE
    if _MM_OUT_DTYPE is None:
        import torch

        try:
            a = torch.ones((2, 2), dtype=torch.bfloat16, device="cuda")
            _MM_OUT_DTYPE = torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OUT_DTYPE = False
    return _MM_OUT_DTYPE


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


def _window_stats(x, k, tok_x):
    """Processed statistics from the window ``x`` (the largest temperature-scaled logits of each
    row, largest first) for top-``k`` rows: logprob of the token (scaled logit ``tok_x``),
    entropy and log-sum-exp of the kept set (float64), and whether ties at the k-th value reach
    the window's end (then the window was too narrow)."""
    import torch

    kth = _kth_largest(x, k)
    keep = x >= kth  # vLLM keeps every value equal to the k-th largest (a prefix of the window)
    xk = torch.where(keep, x, float("-inf")).double()
    lse = xk.logsumexp(dim=1)
    logp = xk - lse.unsqueeze(1)
    p = logp.exp()
    ent = -torch.where(p > 0, p * logp, 0.0).sum(dim=1)
    lp = torch.where(tok_x >= kth.squeeze(1), tok_x.double() - lse, float("-inf"))
    return lp, ent, lse, keep[:, -1]


def _window_stats_top_p(x, idx, k, top_p, has_p, tok, tok_x):
    """:func:`_window_stats` with top-p after top-k on the rows where ``has_p`` holds: the
    reference's cut (ascending, float32 softmax and cumulative sum) inside the kept set."""
    import torch

    kth = _kth_largest(x, k)
    keep = x >= kth
    ninf = torch.tensor(float("-inf"), device=x.device, dtype=x.dtype)
    asc = torch.where(keep, x, ninf).flip(1)
    cut = _top_p_cut(asc, top_p) & has_p.unsqueeze(1)
    xk = torch.where(cut, ninf, asc).flip(1)
    tok_in = (tok_x >= kth.squeeze(1)) & ((idx == tok.unsqueeze(1)) & (xk > ninf)).any(dim=1)
    edge = torch.where(xk > ninf, xk, torch.full_like(xk, float("inf"))).amin(dim=1)  # smallest kept (scaled)
    xk = xk.double()
    lse = xk.logsumexp(dim=1)
    ent = _entropy(xk - lse.unsqueeze(1))
    lp = torch.where(tok_in, tok_x.double() - lse, float("-inf"))
    return lp, ent, lse, keep[:, -1], edge


def _window(vals, idx, t, k, top_p, has_p, tok, tok_x, with_p: bool, compile: bool):
    """The processed statistics of top-k rows from their window (the largest logits ``vals``, at
    vocabulary ids ``idx``; temperature ``t``): :func:`_window_stats_top_p` where ``with_p`` (some
    row also has top-p), else :func:`_window_stats`; with the cut edge, the smallest kept logit
    before the temperature (the k-th logit, ties kept, without top-p)."""
    x = vals / t  # the same division as the reference: the same values, the same ties
    if with_p:
        lp, ent, lse, over, edge = _window_stats_top_p(x, idx, k, top_p, has_p, tok, tok_x)
        return lp, ent, lse, over, edge * t.squeeze(1)
    lp, ent, lse, over = _call(_window_stats, x, k, tok_x, compile=compile)
    return lp, ent, lse, over, _kth_largest(vals, k).squeeze(1)


def _chunk_stats(m, s1, u1, st, ut, rank, tok_logit, tok_x, mt, lp_k, ent_k, lse_k, has_k):
    """The seven statistics of a chunk ``(7, N)`` float64 from its reductions (see
    :func:`_vocab_sums`) and, for top-k rows (``has_k``), its window statistics."""
    import torch

    m, log_s1, log_st = m.double(), s1.log(), st.log()
    mt, tok_x = mt.double(), tok_x.double()
    full_t = mt + log_st  # log-sum-exp of l / t over the vocabulary
    # no top-k / top-p: the processed distribution is the full one at temperature t
    plp = torch.where(has_k, lp_k, tok_x - full_t)
    pent = torch.where(has_k, ent_k, log_st - ut / st)
    kept = torch.where(has_k, (lse_k - full_t).clamp(max=0.0), 0.0)
    return torch.stack([tok_logit.double() - (m + log_s1), plp, log_s1 - u1 / s1, pent, m, rank.double(), kept])


def head_stats(hidden, weight, bias, token_ids, temperature, top_k, top_p, head_dtype,
               chunk_tokens: int | None = None, compile: bool | None = None,
               fp32_gemm: str = "auto") -> dict[str, np.ndarray]:
    """Per-token LM-head statistics of ``hidden`` ``(N, H)`` (see the module docstring; nats).

    The head is applied ``chunk_tokens`` rows at a time (peak memory about ``chunk_tokens x vocab``
    floats). On the same logits (``head_stats_reference(..., fp32_gemm=fp32_gemm)``) it agrees with
    :func:`head_stats_reference` to 1e-5 nats in float32 (``tests/test_score_fast.py``); against
    the reference's default SGEMM logits, ``fp32_gemm="auto"`` on CUDA can differ more at rows with
    a top-k tie or a top-p edge (:func:`project`).

    Parameters
    ----------
    hidden : torch.Tensor
        ``(N, H)`` last hidden states, one row per token.
    weight : torch.Tensor
        ``(V, H)`` LM-head weight.
    bias : torch.Tensor or None
        ``(V,)`` LM-head bias, or None.
    token_ids : torch.Tensor
        ``(N,)`` the sampled token of each row, on ``hidden``'s device.
    temperature : torch.Tensor
        ``(N,)`` per-row temperature (below ``SAMPLING_EPS``: greedy).
    top_k : torch.Tensor
        ``(N,)`` per-row top-k; 0 = off.
    top_p : torch.Tensor
        ``(N,)`` per-row top-p; 1 = off.
    head_dtype : str or torch.dtype
        Precision of the head projection.
    chunk_tokens : int, optional
        Rows per chunk; None: 2048 on CUDA, 512 on CPU.
    compile : bool, optional
        Fuse the full-vocabulary reduction and the per-row arithmetic with ``torch.compile``;
        None: on CUDA, and on CPU from a 32k vocabulary (where the one-time compile pays for itself
        within a few chunks).
    fp32_gemm : {"auto", "cast"}, default "auto"
        How a float32 head multiplies 16-bit inputs (:func:`project`).

    Returns
    -------
    dict of str to numpy.ndarray
        One ``(N,)`` array per name of :data:`STATS` (logprobs and entropies in nats,
        ``trainer_token_rank`` int64, ``trainer_cut_margin`` NaN where nothing is cut).
    """
    import torch

    n = hidden.shape[0]
    if n == 0:
        return {k: (np.zeros(0, dtype=np.int64) if k == "trainer_token_rank" else np.zeros(0)) for k in STATS}
    vocab = weight.shape[0]
    cuda = hidden.is_cuda
    compile = (cuda or vocab >= COMPILE_MIN_VOCAB) if compile is None else bool(compile)
    chunk_tokens = int(chunk_tokens or (2048 if cuda else 512))
    # which rows need what, decided once on the host (per-row settings; no device sync per chunk)
    t_h, k_h, p_h = (a.detach().cpu().numpy() for a in (temperature, top_k, top_p))
    greedy_h = t_h < SAMPLING_EPS
    has_k_h = (k_h > 0) & (k_h < vocab) & ~greedy_h
    has_p_h = (p_h < 1.0) & ~greedy_h
    need_t = bool(((t_h != 1.0) & ~greedy_h).any())
    greedy = temperature < SAMPLING_EPS
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).float().unsqueeze(1)
    has_k = (top_k > 0) & (top_k < vocab) & ~greedy
    has_p = (top_p < 1.0) & ~greedy
    k = torch.where(has_k, top_k, torch.ones_like(top_k))
    out = torch.empty((len(STATS), n), dtype=torch.float64, device=hidden.device)
    out[7] = float("nan")  # trainer_cut_margin: NaN where nothing is cut
    overflow = torch.zeros(n, dtype=torch.bool, device=hidden.device)
    for s in range(0, n, chunk_tokens):
        sl = slice(s, min(s + chunk_tokens, n))
        logits = project(hidden[sl], weight, bias, head_dtype, fp32_gemm)
        tok = token_ids[sl]
        tok_logit = logits.gather(1, tok.unsqueeze(1))
        t = temp[sl]
        any_k = bool(has_k_h[sl].any())
        width = int(k_h[sl][has_k_h[sl]].max()) + TOPK_SLACK if any_k else None
        m, vals, idx = row_max_and_window(logits, width)
        if compile:
            s1, u1, st, ut, rank = _call(_vocab_sums, logits, m, tok_logit, t, compile=True)
        else:
            s1, u1, st, ut, rank = _vocab_sums_eager(logits, m, tok_logit, t, need_t)
        m = m.squeeze(1)
        # float32 divisions, exactly as the reference scales (ties and membership depend on them)
        mt = m.unsqueeze(1).div(t).squeeze(1)  # max of l / t: the shift of the reference's logsumexp
        tok_x = tok_logit.div(t).squeeze(1)
        hk = has_k[sl]
        if any_k:
            lp_k, ent_k, lse_k, over, edge_raw = _window(vals, idx, t, k[sl], top_p[sl], has_p[sl], tok, tok_x,
                                                         bool((has_p_h[sl] & has_k_h[sl]).any()), compile)
            out[7, sl] = torch.where(hk, (edge_raw - tok_logit.squeeze(1)).double(), float("nan"))
            if width < vocab:
                overflow[sl] = over & hk
        else:
            lp_k = ent_k = lse_k = torch.zeros_like(mt, dtype=torch.float64)
        out[:7, sl] = _call(_chunk_stats, m, s1, u1, st, ut, rank, tok_logit.squeeze(1), tok_x, mt,
                           lp_k, ent_k, lse_k, hk, compile=compile)
        del logits
    # top-p without top-k needs the whole sorted row: the reference's processed statistics,
    # for those rows only
    slow = np.flatnonzero(has_p_h & ~has_k_h)
    for s in range(0, len(slow), chunk_tokens):
        rows = torch.as_tensor(slow[s: s + chunk_tokens], device=hidden.device)
        lg = project(hidden[rows], weight, bias, head_dtype, fp32_gemm)
        proc = processed_logits(lg, temperature[rows], top_k[rows], top_p[rows])
        pl = proc.log_softmax(dim=1)
        out[1, rows] = pl.gather(1, token_ids[rows].unsqueeze(1)).squeeze(1).double()
        out[3, rows] = _entropy(pl).double()
        out[6, rows] = (proc.logsumexp(dim=1) - (lg / temp[rows]).logsumexp(dim=1)).clamp(max=0.0).double()
        out[7, rows] = cut_margin(lg, proc, lg.gather(1, token_ids[rows].unsqueeze(1))).double()
    # ties at the k-th value that ran past the window: wider windows
    ties = np.flatnonzero(overflow.cpu().numpy())
    for s in range(0, len(ties), chunk_tokens):
        idx = ties[s: s + chunk_tokens]
        rows = torch.as_tensor(idx, device=hidden.device)
        lg = project(hidden[rows], weight, bias, head_dtype, fp32_gemm)
        t = temp[rows]
        tok = token_ids[rows]
        tok_x = lg.gather(1, tok.unsqueeze(1)).div(t).squeeze(1)
        width = int(k_h[idx].max()) + TOPK_SLACK
        while True:
            width = min(4 * width, vocab)
            vals, ix = lg.topk(width, dim=1)
            lp_k, ent_k, lse_k, over, edge_raw = _window(vals, ix, t, k[rows], top_p[rows], has_p[rows], tok, tok_x,
                                                         bool(has_p_h[idx].any()), compile=False)
            if width >= vocab or not bool(over.any()):
                break
        out[7, rows] = (edge_raw - lg.gather(1, tok.unsqueeze(1)).squeeze(1)).double()
        out[1, rows] = lp_k
        out[3, rows] = ent_k
        out[6, rows] = (lse_k - (lg / t).logsumexp(dim=1).double()).clamp(max=0.0)
    host = out.cpu().numpy()
    res = {name: host[i] for i, name in enumerate(STATS)}
    res["trainer_token_rank"] = host[5].astype(np.int64)
    return res
