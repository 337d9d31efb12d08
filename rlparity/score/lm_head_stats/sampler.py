"""vLLM's sampler on float32 logits: temperature, top-k with the ties at its boundary, top-p; the
statistics' names and the entropy of a row (torch and numpy only)."""

from __future__ import annotations

SAMPLING_EPS = 1e-5  # vLLM's threshold for greedy
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


__all__ = ["SAMPLING_EPS", "STATS", "cut_margin", "processed_logits"]
