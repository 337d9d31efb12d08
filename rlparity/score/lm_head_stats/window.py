"""The processed statistics of top-k rows from the window of their largest logits (the kept set,
its log-sum-exp and entropy, on ``k`` values only)."""

from __future__ import annotations

from .reductions import _call
from .sampler import _entropy, _kth_largest, _top_p_cut

TOPK_SLACK = 8  # candidates fetched past the largest k, to see whether ties at the k-th value go on


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


__all__ = ["TOPK_SLACK"]
