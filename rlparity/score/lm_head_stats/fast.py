"""The fast LM-head statistics (issue 16): one fused full-vocabulary reduction per chunk of rows,
the processed statistics from a window of the largest logits, and the two kinds of rows that need
more (top-p without top-k: the reference's whole sorted row; ties at the k-th value past the
window: wider windows)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .projection import project
from .reductions import COMPILE_MIN_VOCAB, _call, _vocab_sums, _vocab_sums_eager, row_max_and_window
from .sampler import SAMPLING_EPS, STATS, _entropy, cut_margin, processed_logits
from .window import TOPK_SLACK, _window


class Head(NamedTuple):
    """The head and its inputs: what every pass projects rows through.

    Parameters
    ----------
    hidden, weight, bias, head_dtype, fp32_gemm : object
        As :func:`head_stats` takes them.
    """

    hidden: Any
    weight: Any
    bias: Any
    head_dtype: Any
    fp32_gemm: str

    def logits(self, rows):
        """The float32 logits of ``rows`` of the hidden states.

        Parameters
        ----------
        rows : slice or torch.Tensor
            The rows.

        Returns
        -------
        torch.Tensor
            ``(len(rows), V)`` float32 logits.
        """
        return project(self.hidden[rows], self.weight, self.bias, self.head_dtype, self.fp32_gemm)


class RowPlan(NamedTuple):
    """Which rows need what, decided once on the host from the per-row settings (no device sync
    per chunk), and the same settings on the device.

    Parameters
    ----------
    k_h : numpy.ndarray
        ``(N,)`` top-k per row (host).
    has_k_h : numpy.ndarray
        ``(N,)`` bool: top-k cuts the row (host).
    has_p_h : numpy.ndarray
        ``(N,)`` bool: top-p cuts the row (host).
    need_t : bool
        Some non-greedy row has a temperature other than 1.
    temp : torch.Tensor
        ``(N, 1)`` float32 temperature, 1 on greedy rows.
    has_k : torch.Tensor
        ``(N,)`` bool, ``has_k_h`` on the device.
    has_p : torch.Tensor
        ``(N,)`` bool, ``has_p_h`` on the device.
    k : torch.Tensor
        ``(N,)`` top-k where it cuts, else 1.
    """

    k_h: np.ndarray
    has_k_h: np.ndarray
    has_p_h: np.ndarray
    need_t: bool
    temp: Any
    has_k: Any
    has_p: Any
    k: Any


class ChunkReductions(NamedTuple):
    """A chunk's full-vocabulary reductions (:func:`~rlparity.score.lm_head_stats.reductions._vocab_sums`)
    and its sampled tokens' logits, one value per row.

    Parameters
    ----------
    m : torch.Tensor
        Row maxima of the logits.
    s1, u1 : torch.Tensor
        ``sum exp(l - m)`` and ``sum exp(l - m) (l - m)``.
    st, ut : torch.Tensor
        The same sums at the row's temperature.
    rank : torch.Tensor
        ``#{l > l_token}``.
    tok_logit : torch.Tensor
        The sampled token's logit.
    tok_x : torch.Tensor
        The sampled token's logit over the temperature.
    mt : torch.Tensor
        The row maximum over the temperature.
    """

    m: Any
    s1: Any
    u1: Any
    st: Any
    ut: Any
    rank: Any
    tok_logit: Any
    tok_x: Any
    mt: Any


class WindowStats(NamedTuple):
    """The processed statistics of top-k rows from their window (float64; zeros where no row of the
    chunk has top-k).

    Parameters
    ----------
    lp : torch.Tensor
        The sampled token's processed logprob.
    ent : torch.Tensor
        The entropy of the kept set.
    lse : torch.Tensor
        The log-sum-exp of the kept set.
    """

    lp: Any
    ent: Any
    lse: Any


def _chunk_stats(r: ChunkReductions, w: WindowStats, has_k):
    """The seven statistics of a chunk ``(7, N)`` float64 from its reductions (see
    :func:`~rlparity.score.lm_head_stats.reductions._vocab_sums`) and, for top-k rows (``has_k``), its window statistics."""
    import torch

    m, log_s1, log_st = r.m.double(), r.s1.log(), r.st.log()
    mt, tok_x = r.mt.double(), r.tok_x.double()
    full_t = mt + log_st  # log-sum-exp of l / t over the vocabulary
    # no top-k / top-p: the processed distribution is the full one at temperature t
    plp = torch.where(has_k, w.lp, tok_x - full_t)
    pent = torch.where(has_k, w.ent, log_st - r.ut / r.st)
    kept = torch.where(has_k, (w.lse - full_t).clamp(max=0.0), 0.0)
    return torch.stack([r.tok_logit.double() - (m + log_s1), plp, log_s1 - r.u1 / r.s1, pent, m, r.rank.double(), kept])


def _plan_rows(temperature, top_k, top_p, vocab: int) -> RowPlan:
    """:class:`RowPlan` of the per-row settings over a vocabulary of ``vocab``."""
    import torch

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
    return RowPlan(k_h, has_k_h, has_p_h, need_t, temp, has_k, has_p, k)


def _fast_chunk(head: Head, token_ids, top_p, plan: RowPlan, sl: slice, out, overflow, compile: bool) -> None:
    """Fill ``out[:, sl]`` (and ``overflow[sl]``: top-k rows whose ties ran past the window) from
    one projection of the chunk ``sl``."""
    import torch

    vocab = head.weight.shape[0]
    logits = head.logits(sl)
    tok = token_ids[sl]
    tok_logit = logits.gather(1, tok.unsqueeze(1))
    t = plan.temp[sl]
    any_k = bool(plan.has_k_h[sl].any())
    width = int(plan.k_h[sl][plan.has_k_h[sl]].max()) + TOPK_SLACK if any_k else None
    m, vals, idx = row_max_and_window(logits, width)
    if compile:
        s1, u1, st, ut, rank = _call(_vocab_sums, logits, m, tok_logit, t, compile=True)
    else:
        s1, u1, st, ut, rank = _vocab_sums_eager(logits, m, tok_logit, t, plan.need_t)
    m = m.squeeze(1)
    # float32 divisions, exactly as the reference scales (ties and membership depend on them)
    mt = m.unsqueeze(1).div(t).squeeze(1)  # max of l / t: the shift of the reference's logsumexp
    tok_x = tok_logit.div(t).squeeze(1)
    hk = plan.has_k[sl]
    if any_k:
        lp_k, ent_k, lse_k, over, edge_raw = _window(vals, idx, t, plan.k[sl], top_p[sl], plan.has_p[sl], tok, tok_x,
                                                     bool((plan.has_p_h[sl] & plan.has_k_h[sl]).any()), compile)
        out[7, sl] = torch.where(hk, (edge_raw - tok_logit.squeeze(1)).double(), float("nan"))
        if width < vocab:
            overflow[sl] = over & hk
    else:
        lp_k = ent_k = lse_k = torch.zeros_like(mt, dtype=torch.float64)
    reductions = ChunkReductions(m, s1, u1, st, ut, rank, tok_logit.squeeze(1), tok_x, mt)
    out[:7, sl] = _call(_chunk_stats, reductions, WindowStats(lp_k, ent_k, lse_k), hk, compile=compile)


def _top_p_rows(head: Head, token_ids, temperature, top_k, top_p, plan: RowPlan, out, chunk_tokens: int) -> None:
    """Top-p without top-k needs the whole sorted row: the reference's processed statistics into
    ``out``, for those rows only."""
    import torch

    slow = np.flatnonzero(plan.has_p_h & ~plan.has_k_h)
    for s in range(0, len(slow), chunk_tokens):
        rows = torch.as_tensor(slow[s: s + chunk_tokens], device=head.hidden.device)
        lg = head.logits(rows)
        proc = processed_logits(lg, temperature[rows], top_k[rows], top_p[rows])
        pl = proc.log_softmax(dim=1)
        out[1, rows] = pl.gather(1, token_ids[rows].unsqueeze(1)).squeeze(1).double()
        out[3, rows] = _entropy(pl).double()
        out[6, rows] = (proc.logsumexp(dim=1) - (lg / plan.temp[rows]).logsumexp(dim=1)).clamp(max=0.0).double()
        out[7, rows] = cut_margin(lg, proc, lg.gather(1, token_ids[rows].unsqueeze(1))).double()


def _tie_rows(head: Head, token_ids, top_p, plan: RowPlan, overflow, out, chunk_tokens: int) -> None:
    """Ties at the k-th value that ran past the window: the processed statistics of those rows
    into ``out``, from windows four times wider until the ties end (or the window is the row)."""
    import torch

    vocab = head.weight.shape[0]
    ties = np.flatnonzero(overflow.cpu().numpy())
    for s in range(0, len(ties), chunk_tokens):
        idx = ties[s: s + chunk_tokens]
        rows = torch.as_tensor(idx, device=head.hidden.device)
        lg = head.logits(rows)
        t = plan.temp[rows]
        tok = token_ids[rows]
        tok_x = lg.gather(1, tok.unsqueeze(1)).div(t).squeeze(1)
        width = int(plan.k_h[idx].max()) + TOPK_SLACK
        while True:
            width = min(4 * width, vocab)
            vals, ix = lg.topk(width, dim=1)
            lp_k, ent_k, lse_k, over, edge_raw = _window(vals, ix, t, plan.k[rows], top_p[rows], plan.has_p[rows], tok,
                                                         tok_x, bool(plan.has_p_h[idx].any()), compile=False)
            if width >= vocab or not bool(over.any()):
                break
        out[7, rows] = (edge_raw - lg.gather(1, tok.unsqueeze(1)).squeeze(1)).double()
        out[1, rows] = lp_k
        out[3, rows] = ent_k
        out[6, rows] = (lse_k - (lg / t).logsumexp(dim=1).double()).clamp(max=0.0)


def head_stats(hidden, weight, bias, token_ids, temperature, top_k, top_p, head_dtype,
               chunk_tokens: int | None = None, compile: bool | None = None,
               fp32_gemm: str = "auto") -> dict[str, np.ndarray]:
    """Per-token LM-head statistics of ``hidden`` ``(N, H)`` (see the package docstring; nats).

    The head is applied ``chunk_tokens`` rows at a time (peak memory about ``chunk_tokens x vocab``
    floats). On the same logits (``head_stats_reference(..., fp32_gemm=fp32_gemm)``) it agrees with
    :func:`~rlparity.score.lm_head_stats.head_stats_reference` to 1e-5 nats in float32
    (``tests/test_score_fast.py``); against the reference's default SGEMM logits,
    ``fp32_gemm="auto"`` on CUDA can differ more at rows with a top-k tie or a top-p edge
    (:func:`~rlparity.score.lm_head_stats.project`).

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
        How a float32 head multiplies 16-bit inputs (:func:`~rlparity.score.lm_head_stats.project`).

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
    head = Head(hidden, weight, bias, head_dtype, fp32_gemm)
    plan = _plan_rows(temperature, top_k, top_p, vocab)
    out = torch.empty((len(STATS), n), dtype=torch.float64, device=hidden.device)
    out[7] = float("nan")  # trainer_cut_margin: NaN where nothing is cut
    overflow = torch.zeros(n, dtype=torch.bool, device=hidden.device)
    for s in range(0, n, chunk_tokens):
        _fast_chunk(head, token_ids, top_p, plan, slice(s, min(s + chunk_tokens, n)), out, overflow, compile)
    _top_p_rows(head, token_ids, temperature, top_k, top_p, plan, out, chunk_tokens)
    _tie_rows(head, token_ids, top_p, plan, overflow, out, chunk_tokens)
    host = out.cpu().numpy()
    res = {name: host[i] for i, name in enumerate(STATS)}
    res["trainer_token_rank"] = host[5].astype(np.int64)
    return res


__all__ = ["ChunkReductions", "Head", "RowPlan", "WindowStats", "head_stats"]
