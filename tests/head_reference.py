"""An independent float64 reference for the trainer's LM-head statistics, for the tests (and
:func:`rows_case`, the hidden states and head that cover every branch, built with torch).

numpy only, one row at a time, written from vLLM's sampler rules and nothing of
``rlparity.score.lm_head_stats`` (which holds both ``head_stats`` and ``head_stats_reference``): so both
can be compared with it. Rules (vLLM's V1 sampler):

* greedy rows (temperature < 1e-5) read the full-vocabulary log-softmax at temperature 1;
* otherwise ``z = logits / temperature``; top-k (0 or >= vocab: off) keeps every ``z`` at least the
  k-th largest (ties at the boundary kept); then top-p (1: off) sorts the kept ``z`` ascending and
  drops those whose cumulative probability is ``<= 1 - top_p``, always keeping the largest;
* the processed distribution is the kept ``z`` renormalised; a sampled token outside it is -inf.

``stable`` marks the rows whose kept set cannot flip under rounding of the inputs: no value of
``z`` within ``margin`` (relative) of the top-k boundary unless equal to it, no cumulative
probability within ``margin`` of ``1 - top_p``, and no tie split by the top-p cut. Comparisons of
the processed statistics are made on those rows; the full-vocabulary ones on every row.
"""

from __future__ import annotations

import numpy as np

GREEDY = 1e-5  # vLLM's temperature threshold for greedy sampling

NAMES = ("trainer_logprob", "trainer_processed_logprob", "trainer_entropy", "trainer_processed_entropy",
         "trainer_max_logit", "trainer_token_rank", "trainer_log_kept_mass", "trainer_cut_margin")


def _lse(x: np.ndarray) -> float:
    m = float(np.max(x))
    return m + float(np.log(np.sum(np.exp(x - m))))


def head_stats_float64(logits, tokens, temperature, top_k, top_p, *, margin: float = 0.0) -> dict[str, np.ndarray]:
    """Per-row statistics of ``logits`` ``(N, V)`` (any float array; computed in float64) for the
    sampled ``tokens``; plus ``stable`` (see the module docstring)."""
    L = np.asarray(logits, dtype=np.float64)
    n, vocab = L.shape
    out = {name: np.full(n, np.nan) for name in NAMES}
    out["trainer_token_rank"] = np.zeros(n, dtype=np.int64)
    stable = np.ones(n, dtype=bool)
    for i in range(n):
        row, tok = L[i], int(tokens[i])
        t, k, p = float(temperature[i]), int(top_k[i]), float(top_p[i])
        logp = row - _lse(row)
        out["trainer_logprob"][i] = logp[tok]
        out["trainer_entropy"][i] = -np.sum(np.exp(logp) * logp)
        out["trainer_max_logit"][i] = row.max()
        out["trainer_token_rank"][i] = int(np.sum(row > row[tok]))
        greedy = t < GREEDY
        z = row if greedy else row / t
        keep = np.ones(vocab, dtype=bool)
        if not greedy and 0 < k < vocab:
            kth = np.sort(z)[::-1][k - 1]
            keep = z >= kth
            below = z[~keep]
            if below.size and kth - below.max() <= margin * max(1.0, abs(kth)):
                stable[i] = False
        if not greedy and p < 1.0:
            idx = np.flatnonzero(keep)
            zk = z[idx]
            order = np.argsort(zk, kind="stable")  # ascending
            q = np.exp(zk[order] - _lse(zk))
            cum = np.cumsum(q)
            cut = cum <= 1.0 - p
            cut[-1] = False
            if np.any(np.abs(cum[:-1] - (1.0 - p)) <= margin):
                stable[i] = False
            n_cut = int(cut.sum())  # a prefix of the ascending order
            if 0 < n_cut < len(order) and zk[order[n_cut - 1]] == zk[order[n_cut]]:
                stable[i] = False  # the cut splits a tie: which of the equal tokens goes is an implementation's choice
            keep = keep.copy()
            keep[idx[order[:n_cut]]] = False
        zk = z[keep]
        lse_k = _lse(zk)
        out["trainer_processed_logprob"][i] = z[tok] - lse_k if keep[tok] else -np.inf
        plogp = zk - lse_k
        out["trainer_processed_entropy"][i] = -np.sum(np.exp(plogp) * plogp)
        if keep.all():
            out["trainer_log_kept_mass"][i] = 0.0
        else:
            out["trainer_log_kept_mass"][i] = min(0.0, lse_k - _lse(z))
            out["trainer_cut_margin"][i] = row[keep].min() - row[tok]
    out["stable"] = stable
    return out


def rows_case(vocab: int, n: int = 600, hidden: int = 32, scale: float = 0.6, seed: int = 0):
    """Hidden states, an LM head and per-row settings covering every branch: greedy rows,
    temperatures 0.7 / 1 / 1.3, top-k off / 1 / 5 / 50 / >= vocab, top-p off / 0.9 / 0.5, ties at
    the k-th value (duplicated head rows: identical logits, more of them than the window's
    slack), sampled tokens at the top, at the k-th place and anywhere."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g) * scale  # logits up to about 20: a trained model's range
    w[100:112] = w[5]  # 13 identical logits
    w[200:240] = w[7]  # 41 identical logits
    rng = np.random.default_rng(seed)
    temp = torch.tensor(rng.choice([0.0, 0.7, 1.0, 1.3], n), dtype=torch.float32)
    k = torch.tensor(rng.choice([0, 1, 5, 50, vocab, vocab + 3], n))
    p = torch.tensor(rng.choice([1.0, 1.0, 0.9, 0.5], n), dtype=torch.float32)
    logits = h @ w.T
    tok = torch.randint(0, vocab, (n,), generator=g)
    order = logits.argsort(dim=1, descending=True)
    tok[0::4] = order[0::4, 0]  # the top token
    tok[1::4] = order[1::4, 49]  # the 50th
    tok[2::8] = 5  # a tied token
    # rows whose k-th value is a tie: the hidden state points at the duplicated rows
    h[3::8] = w[5] * 3 + 0.01 * h[3::8]
    k[3::8] = 5
    return h, w, tok, temp, k, p


def compare(got: dict, ref: dict, tol: float, *, rows: np.ndarray | None = None) -> dict[str, float]:
    """Assert ``got`` (an implementation's statistics) equals ``ref`` (:func:`head_stats_float64`):
    the full-vocabulary statistics on every row (``rows``: a subset), the processed ones on the
    stable rows; the same -inf and NaN places; finite values within ``tol``. Returns the largest
    difference per statistic."""
    n = len(ref["trainer_logprob"])
    sel = np.ones(n, dtype=bool) if rows is None else np.asarray(rows, dtype=bool)
    worst = {}
    for name in NAMES:
        where = sel & ref["stable"] if name in ("trainer_processed_logprob", "trainer_processed_entropy",
                                                "trainer_log_kept_mass", "trainer_cut_margin") else sel
        x = np.asarray(got[name], dtype=np.float64)[where]
        y = np.asarray(ref[name], dtype=np.float64)[where]
        odd = ~np.isfinite(y)
        assert np.array_equal(~np.isfinite(x), odd), f"{name}: -inf/NaN at other tokens than the float64 reference"
        assert np.array_equal(x[odd], y[odd], equal_nan=True), f"{name}: -inf where the reference has NaN, or back"
        d = float(np.abs(x[~odd] - y[~odd]).max()) if (~odd).any() else 0.0
        worst[name] = d
        assert d <= tol, f"{name}: max |implementation - float64 reference| = {d:.2e} > {tol:.0e}"
    return worst
