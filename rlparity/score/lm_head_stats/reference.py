"""The straightforward LM-head statistics (several full-vocabulary passes per statistic): what the
fast path is checked against."""

from __future__ import annotations

import numpy as np

from .projection import project
from .sampler import SAMPLING_EPS, STATS, _entropy, cut_margin, processed_logits


def head_stats_reference(hidden, weight, bias, token_ids, temperature, top_k, top_p, head_dtype,
                         chunk_tokens: int = 512, fp32_gemm: str = "cast") -> dict[str, np.ndarray]:
    """The implementation of :func:`~rlparity.score.lm_head_stats.head_stats` before issue 16 (same arguments,
    same result).

    Every statistic comes from its own full-vocabulary pass, one host copy per statistic and
    chunk. Slow; kept for the equality tests and ``benchmarks/rescoring.py``.

    Parameters
    ----------
    hidden, weight, bias, token_ids, temperature, top_k, top_p, head_dtype
        The hidden states, the head, the sampled tokens and the per-row sampling settings, as
        :func:`~rlparity.score.lm_head_stats.head_stats` documents them.
    chunk_tokens : int, default 512
        Rows per chunk.
    fp32_gemm : str, default "cast"
        ``"cast"``: cast hidden states and weight to ``head_dtype`` and multiply; ``"auto"``:
        project as :func:`~rlparity.score.lm_head_stats.project` does (to compare the statistics on
        the same logits).

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


__all__ = ["head_stats_reference"]
