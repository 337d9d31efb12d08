"""Seeded synthetic traces for fast unit tests of metrics, validation and plots.

These stand beside the real-engine tests, never instead of them: they exercise the numerics of
rlparity on traces whose answer is known by construction (e.g. a raw-vs-processed offset of a
chosen temperature), without starting vLLM.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import xarray as xr

from rlparity.trace import from_rollouts, pad_rows, token_checksum, with_trainer


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def synthetic_trace(
    n_sequences: int = 16,
    max_len: int = 24,
    vocab: int = 32,
    *,
    temperature: float = 0.7,
    top_k: int = 0,
    top_p: float = 1.0,
    logprobs_mode: str = "processed_logprobs",
    noise: float = 0.0,
    head_noise: float = 0.0,
    trainer_noise: float = 0.0,
    seed: int = 0,
    scored: bool = True,
    arm: str = "synthetic",
) -> xr.Dataset:
    """A trace whose rollout and trainer sides come from one known logit model.

    Tokens are sampled from the processed distribution (temperature, top-k, top-p) as vLLM would;
    the rollout logprob is the raw or processed logprob according to ``logprobs_mode``. For fast
    unit tests beside the real-engine tests, never instead of them.

    Parameters
    ----------
    n_sequences : int, default 16
        Sequences.
    max_len : int, default 24
        The longest response; lengths are drawn from ``[max_len // 2, max_len]``.
    vocab : int, default 32
        Vocabulary size.
    temperature : float, default 0.7
        The sampling temperature.
    top_k : int, default 0
        The sampling top-k (0 = off).
    top_p : float, default 1.0
        The sampling top-p (1 = off).
    logprobs_mode : {"processed_logprobs", "raw_logprobs"}, default "processed_logprobs"
        Which logprob the rollout side reports.
    noise : float, default 0.0
        Standard deviation (nats) of Gaussian noise on the rollout logprobs only (capped at 0).
    head_noise : float, default 0.0
        Standard deviation of noise on the rollout logits before the softmax (a stand-in for a
        low-precision LM head): the engine samples its tokens from the noisy distribution and reports
        their logprobs under it.
    trainer_noise : float, default 0.0
        Standard deviation of noise on the trainer's logits (a stand-in for dropout left on): one
        draw feeds both trainer readings, its scale varies by sequence (log-normal, as a dropout
        mask hits some sequences far harder than others).
    seed : int, default 0
        Seeds everything; request seeds are ``seed + i``.
    scored : bool, default True
        Fill the trainer variables exactly (no noise): both readings, entropies, max logit, rank,
        kept mass and cut margin.
    arm : str, default "synthetic"
        The arm's name.

    Returns
    -------
    xarray.Dataset
        The trace (rollout side only when ``scored`` is ``False``).
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, max_len // 2), max_len + 1, size=n_sequences)
    model = _LogitModel(vocab, temperature, top_k, top_p, logprobs_mode, noise, head_noise, trainer_noise)
    rows = [_sequence(rng, int(L), model) for L in lengths]
    ds = from_rollouts(
        prompt_token_ids=[r["prompt"] for r in rows], token_ids=[r["token"] for r in rows],
        rollout_logprobs=[r["mu"] for r in rows],
        finish_reasons=["length"] * n_sequences, temperature=temperature, top_k=top_k,
        top_p=top_p, request_seed=np.arange(n_sequences) + seed,
        attrs={"arm": arm, "capture_backend": "synthetic", "model": "synthetic",
               "engine_requested": {"logprobs_mode": logprobs_mode},
               "engine_effective": {"logprobs_mode": logprobs_mode, "head_dtype": "float32",
                                    "dtype": "float32"},
               "synthetic": {"seed": seed, "noise": noise, "head_noise": head_noise,
                             "trainer_noise": trainer_noise}},
    )
    return _with_exact_trainer(ds, rows) if scored else ds


class _LogitModel(NamedTuple):
    """The sampling settings and noises of :func:`synthetic_trace`."""

    vocab: int
    temperature: float
    top_k: int
    top_p: float
    logprobs_mode: str
    noise: float
    head_noise: float
    trainer_noise: float


def _processed_logits(logits: np.ndarray, m: _LogitModel) -> np.ndarray:
    """vLLM's sampler transform of ``logits`` ``(L, vocab)``: temperature, top-k, top-p (``-inf`` where cut)."""
    scaled = logits / m.temperature
    if m.top_k and m.top_k < m.vocab:
        kth = np.sort(scaled, axis=1)[:, -m.top_k][:, None]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    if m.top_p < 1.0:
        order = np.argsort(scaled, axis=1)
        srt = np.take_along_axis(scaled, order, axis=1)
        cum = np.cumsum(np.exp(_log_softmax(srt)), axis=1)
        mask = cum <= 1 - m.top_p
        mask[:, -1] = False
        srt = np.where(mask, -np.inf, srt)
        scaled = np.empty_like(srt)
        np.put_along_axis(scaled, order, srt, axis=1)
    return scaled


def _sequence(rng: np.random.Generator, L: int, m: _LogitModel) -> dict[str, Any]:
    """One sequence of ``L`` tokens drawn from the logit model: the prompt, the tokens, the rollout
    logprobs (``mu``) and the trainer's exact statistics (the random draws in one fixed order)."""
    vocab, temperature = m.vocab, m.temperature
    logits = rng.normal(0, 2.5, size=(L, vocab))
    scaled = _processed_logits(logits, m)
    plog = _log_softmax(scaled)
    full = logits / temperature
    fm = full.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        kept = np.log(np.exp(scaled - fm).sum(axis=1)) - np.log(np.exp(full - fm).sum(axis=1))
    rlog = _log_softmax(logits)
    # the engine samples from its own (noisy-head) processed distribution, as a low-precision head does
    roll_logits = logits + rng.normal(0, m.head_noise, size=logits.shape) if m.head_noise else logits
    roll_scaled = np.where(np.isfinite(scaled), roll_logits / temperature, -np.inf)
    sampler = _log_softmax(roll_scaled) if m.head_noise else plog
    t = np.array([rng.choice(vocab, p=np.exp(row)) for row in sampler])
    idx = np.arange(L)
    cut = ~np.isfinite(scaled).all(axis=1)
    edge = np.where(np.isfinite(scaled), logits, np.inf).min(axis=1)
    margin = np.where(cut, edge - logits[idx, t], np.nan)
    roll = (_log_softmax(roll_scaled) if m.logprobs_mode == "processed_logprobs"
            else _log_softmax(roll_logits))[idx, t]
    roll = np.minimum(roll + rng.normal(0, m.noise, size=L), 0.0) if m.noise else roll
    out = {"prompt": rng.integers(4, vocab, size=rng.integers(3, 8)).tolist(), "token": t.tolist(),
           "mu": roll.tolist()}
    if m.trainer_noise:
        noisy = logits + rng.normal(0, m.trainer_noise * rng.lognormal(0, 1), size=logits.shape)
        out["pi"] = _log_softmax(noisy)[idx, t]
        out["ppi"] = _log_softmax(np.where(np.isfinite(scaled), noisy / temperature, -np.inf))[idx, t]
    else:
        out["pi"] = rlog[idx, t]
        out["ppi"] = plog[idx, t]
    p = np.exp(rlog)
    pp = np.exp(plog)
    out.update(ent=-(p * rlog).sum(axis=1), pent=-(pp * np.where(pp > 0, plog, 0.0)).sum(axis=1),
               maxl=logits.max(axis=1), rank=(logits > logits[idx, t][:, None]).sum(axis=1), kept=kept,
               margin=margin)
    return out


def _with_exact_trainer(ds: xr.Dataset, rows: list[dict[str, Any]]) -> xr.Dataset:
    """``ds`` with the trainer variables of every sequence, exactly (no noise but the trainer's own)."""
    width = ds.sizes["position"]

    def pad(key, fill=np.nan, dtype=float):
        return pad_rows([r[key] for r in rows], fill, dtype, width=width)

    ds = with_trainer(ds, {
        "trainer_logprob": pad("pi"), "trainer_processed_logprob": pad("ppi"),
        "trainer_entropy": pad("ent"), "trainer_processed_entropy": pad("pent"),
        "trainer_max_logit": pad("maxl"), "trainer_token_rank": pad("rank", -1, np.int64),
        "trainer_log_kept_mass": np.minimum(pad("kept"), 0.0), "trainer_cut_margin": pad("margin"),
    }, {"trainer": {"model": "synthetic", "dtype": "float32", "head_dtype": "float32"}})
    ds.attrs["scored_token_checksum"] = token_checksum(ds)
    return ds
