"""Trainer-side rescoring with transformers: recompute the rollout's tokens as a trainer would.

For every response token the trainer computes, from the same prompt + response ids:

* ``trainer_logprob``: log-softmax over the full vocabulary at temperature 1 (what vLLM calls
  ``raw_logprobs``; pi_old in the objective);
* ``trainer_processed_logprob``: the distribution vLLM's sampler draws from: logits / temperature,
  then top-k, then top-p, renormalised (what ``processed_logprobs`` returns). Ties at the top-k
  boundary are **kept**, exactly as vLLM does: every token whose logit equals the k-th largest
  survives, so more than k tokens can remain. Top-p masks, in ascending order, the tokens whose
  cumulative probability is ``<= 1 - top_p`` and always keeps the most likely one. A sampled token
  outside the trainer's kept set gets ``-inf``: counted by the metrics, never averaged away.
  Greedy requests (temperature < 1e-5) get the full-vocabulary log-softmax, as in vLLM.
* entropies of both distributions, the largest logit and the sampled token's rank.

The LM head runs in ``head_dtype`` (``float32`` as trainers do, or ``bfloat16``) and is applied in
chunks of ``chunk_tokens`` rows, so peak memory is ``chunk_tokens x vocab`` whatever the sequence
length. The statistics come from :func:`rlparity.score.head.head_stats` (one fused pass over the
vocabulary and a top-k window; within 1e-5 nats of the reference ``head_stats_reference``): on an
H200 the float32 head rescoring runs at 0.88x the throughput of a bare bf16 forward
(``benchmarks/README.md``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from rlparity.score.head import (
    FP32_GEMMS,
    SAMPLING_EPS,
    STATS,
    head_stats,
    head_stats_reference,
    processed_logits,
    project,
)
from rlparity.trace import latest_version, sequences, token_checksum, trace_versions, validate
from rlparity.trace.prompts import chat_token_ids
from rlparity.trace.schema import TOKEN_DIMS, annotate

__all__ = ["FP32_GEMMS", "SAMPLING_EPS", "STATS", "Scorer", "head_stats", "head_stats_reference", "processed_logits",
           "project", "score", "tokenize_prompts", "trainer_prompt_ids"]


@dataclass
class Scorer:
    """A transformers model loaded once, to rescore many traces (the trainer side).

    ``dtype`` is the body's precision, ``head_dtype`` the LM head's. ``model`` is a local path or
    a hub id, loaded with ``from_pretrained`` exactly as a user's trainer would, or an already
    loaded model, used as it is (e.g. the trainer's after an optimizer step; ``dtype`` then reads
    the model's own).
    """

    model: Any  # a path or hub id, or an already loaded transformers causal LM
    dtype: str = "float32"
    head_dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 16
    chunk_tokens: int | None = None  # LM-head rows per chunk (None: 2048 on CUDA, 512 on CPU)
    trust_remote_code: bool = False
    progress: bool = True
    tokenize_prompts: bool = True
    add_special_tokens: bool = True
    compile_head: bool | None = None  # torch.compile the LM-head reductions (None: see head_stats)
    fp32_gemm: str = "auto"  # how a float32 head multiplies 16-bit inputs (see rlparity.score.head.project)

    def __post_init__(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        for name in ("dtype", "head_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"{name}={getattr(self, name)!r}; use float32, bfloat16 or float16")
        if self.fp32_gemm not in FP32_GEMMS:
            raise ValueError(f"fp32_gemm={self.fp32_gemm!r}; use one of {FP32_GEMMS}")
        if hasattr(self.model, "get_decoder"):  # a loaded model (e.g. the trainer's, after a step)
            self.module = self.model.to(self.device)
            self.dtype = str(self.module.dtype).removeprefix("torch.")  # what it is, not what was asked
        else:
            self.module = AutoModelForCausalLM.from_pretrained(
                str(self.model), dtype=getattr(torch, self.dtype),
                trust_remote_code=self.trust_remote_code).to(self.device).eval()
        self.decoder = self.module.get_decoder()
        head = self.module.get_output_embeddings()
        self.head_weight = head.weight
        self.head_bias = getattr(head, "bias", None)
        self._tokenizer = None

    @property
    def tokenizer(self):
        """The trainer's tokenizer (loaded on first use, from the same model)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_name,
                                                            trust_remote_code=self.trust_remote_code)
        return self._tokenizer

    @property
    def model_name(self) -> str:
        """The model's path or hub id (a loaded model's ``name_or_path``)."""
        return str(getattr(self.model, "name_or_path", self.model))

    def batches(self, seqs: list[tuple[list[int], list[int]]]) -> Iterator[list[int]]:
        """Indices of ``seqs`` in batches of ``batch_size``, similar lengths together."""
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
        for s in range(0, len(order), self.batch_size):
            yield order[s: s + self.batch_size]

    def response_hidden(self, seqs: list[tuple[list[int], list[int]]], batch: list[int]) -> list:
        """One forward of the body over ``batch`` (indices into ``seqs`` of (prompt, response)
        ids): per sequence, the last hidden states ``(rlen, H)`` at the positions that predict its
        response tokens. Gradients flow unless the caller turns them off."""
        import torch

        full = [seqs[i][0] + seqs[i][1] for i in batch]
        L = max(len(f) for f in full)
        ids = torch.zeros((len(batch), L), dtype=torch.long)
        att = torch.zeros((len(batch), L), dtype=torch.long)
        for r, f in enumerate(full):
            ids[r, : len(f)] = torch.tensor(f)
            att[r, : len(f)] = 1
        hidden = self.decoder(input_ids=ids.to(self.device), attention_mask=att.to(self.device)).last_hidden_state
        return [hidden[r, len(seqs[i][0]) - 1: len(seqs[i][0]) - 1 + len(seqs[i][1])] for r, i in enumerate(batch)]

    def score(self, trace: xr.Dataset) -> xr.Dataset:
        """Return a copy of ``trace`` with the trainer variables added."""
        import torch
        from tqdm.auto import tqdm

        validate(trace)
        seqs = sequences(trace)
        n, width = trace.sizes["sequence"], trace.sizes["position"]
        result = {k: (np.full((n, width), -1, dtype=np.int64) if k == "trainer_token_rank"
                      else np.full((n, width), np.nan)) for k in STATS}
        temp = trace["temperature"].values
        topk = trace["top_k"].values
        topp = trace["top_p"].values
        t0 = time.perf_counter()
        batches = list(self.batches(seqs))
        training = self.module.training
        self.module.eval()  # no dropout while scoring, whatever mode a loaded model was in
        with torch.inference_mode():
            for batch in tqdm(batches, desc="trainer rescoring", disable=not self.progress):
                hidden = self.response_hidden(seqs, batch)
                rows, toks, tt, tk, tp, where = [], [], [], [], [], []
                for r, i in enumerate(batch):
                    rlen = len(seqs[i][1])
                    if rlen == 0:
                        continue
                    rows.append(hidden[r])
                    toks.append(torch.tensor(seqs[i][1]))
                    tt.append(torch.full((rlen,), float(temp[i])))
                    tk.append(torch.full((rlen,), int(topk[i]), dtype=torch.long))
                    tp.append(torch.full((rlen,), float(topp[i])))
                    where.append((i, rlen))
                if not rows:
                    continue
                stats = head_stats(torch.cat(rows), self.head_weight, self.head_bias,
                                   torch.cat(toks).to(self.device), torch.cat(tt).to(self.device),
                                   torch.cat(tk).to(self.device), torch.cat(tp).to(self.device),
                                   self.head_dtype, self.chunk_tokens, compile=self.compile_head,
                                   fp32_gemm=self.fp32_gemm)
                off = 0
                for i, rlen in where:
                    for k, v in stats.items():
                        result[k][i, :rlen] = v[off: off + rlen]
                    off += rlen
        self.module.train(training)
        out = trace.copy()
        for k, v in result.items():
            out[k] = (TOKEN_DIMS, v)
        if self.tokenize_prompts:
            out = tokenize_prompts(out, self.tokenizer, add_special_tokens=self.add_special_tokens)
        out.attrs.update(self.attrs(trace, time.perf_counter() - t0))
        return validate(annotate(out))

    def attrs(self, trace: xr.Dataset, elapsed: float) -> dict[str, Any]:
        from rlparity.config.provenance import jsonable

        return jsonable({
            "trainer": {"model": self.model_name, "dtype": self.dtype, "head_dtype": self.head_dtype,
                        "fp32_gemm": self.fp32_gemm,
                        "device": self.device, "library": "transformers",
                        "topk_ties": "kept (vLLM rule: logits equal to the k-th largest survive)",
                        "prompt_tokenization": ({"add_special_tokens": self.add_special_tokens,
                                                 "chat_template": "apply_chat_template(tokenize=True, add_generation_prompt=True)"}
                                                if self.tokenize_prompts else None),
                        "score_s": round(elapsed, 3)},
            "scored_token_checksum": token_checksum(trace),
        })


def trainer_prompt_ids(tokenizer, text: str, messages_json: str = "", *,
                       add_special_tokens: bool = True) -> list[int] | None:
    """How the trainer tokenizes one prompt: chat messages through the chat template, text with
    ``add_special_tokens``; ``None`` when there is nothing to tokenize (ids-only prompt)."""
    import json

    if messages_json:
        return chat_token_ids(tokenizer, json.loads(messages_json))
    if text:
        return [int(t) for t in tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]
    return None


def tokenize_prompts(trace: xr.Dataset, tokenizer, *, add_special_tokens: bool = True) -> xr.Dataset:
    """Add ``trainer_prompt_token_id`` / ``trainer_prompt_length``: the trainer's own tokenization
    of each prompt's text (or chat messages), to compare with the ids the engine was sent."""
    texts = trace["prompt_text"].values if "prompt_text" in trace else [""] * trace.sizes["sequence"]
    msgs = trace["prompt_messages"].values if "prompt_messages" in trace else [""] * len(texts)
    rows = [trainer_prompt_ids(tokenizer, str(t), str(m), add_special_tokens=add_special_tokens)
            for t, m in zip(texts, msgs)]
    width = max([len(r) for r in rows if r is not None], default=0)
    ids = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        if r:
            ids[i, : len(r)] = r
    out = trace.copy()
    out["trainer_prompt_token_id"] = (("sequence", "trainer_prompt_position"), ids)
    out["trainer_prompt_length"] = (("sequence",), np.array([-1 if r is None else len(r) for r in rows],
                                                            dtype=np.int64))
    return annotate(out)


TOKEN_TRAINER_VARS = ("trainer_logprob", "trainer_processed_logprob", "trainer_entropy",
                      "trainer_processed_entropy", "trainer_max_logit", "trainer_log_kept_mass", "trainer_token_rank")
LATEST_VARS = {"trainer_logprob": "trainer_latest_logprob",
               "trainer_processed_logprob": "trainer_latest_processed_logprob"}


def score_versions(trace: xr.Dataset, checkpoints: Any, *, latest: bool | int = True,
                   **scorer_kwargs: Any) -> xr.Dataset:
    """Rescore ``trace`` so that every token is scored by the weights that produced it.

    ``checkpoints`` maps a policy version to its weights: a checkpoint path or hub id, a loaded
    transformers model, or a ready :class:`Scorer` (reused as is; the others are made with
    ``scorer_kwargs``, e.g. ``dtype``, ``head_dtype``, ``device``). For each version one forward runs
    over the sequences that contain it, and each token takes its values (``trainer_logprob``,
    ``trainer_processed_logprob``, entropies, ...) from its own version's forward, so
    ``d = log pi_old - log mu`` compares like with like even for sequences that straddle an update.

    ``latest`` (True: :func:`latest_version`; or a version) also scores every token with the latest
    weights into ``trainer_latest_logprob`` / ``trainer_latest_processed_logprob``: what an
    on-policy trainer that ignores versions computes; the gap between the two readings is the
    off-policy share of the mismatch. ``False`` skips it.
    """
    from collections.abc import Mapping

    validate(trace)
    if not isinstance(checkpoints, Mapping) or not checkpoints:
        raise TypeError("checkpoints must map policy version -> checkpoint path, model or Scorer, "
                        "e.g. {0: 'ckpt-v0', 1: 'ckpt-v1'}")
    ckpts = {int(k): v for k, v in checkpoints.items()}
    versions = trace_versions(trace)
    latest_v = None if latest is False or latest is None else (latest_version(trace) if latest is True else int(latest))
    needed = sorted(set(versions) | ({latest_v} if latest_v is not None else set()))
    missing = [v for v in needed if v not in ckpts]
    if missing:
        raise ValueError(f"no checkpoint for policy version(s) {missing}: the trace's tokens come from versions "
                         f"{versions}{f' (latest {latest_v})' if latest_v is not None else ''}; pass "
                         "checkpoints={version: path_or_model, ...} for each")

    def scorer(v: int) -> Scorer:
        c = ckpts[v]
        return c if isinstance(c, Scorer) else Scorer(c, **{"progress": False, **scorer_kwargs})

    pv = trace["policy_version"].values
    mask = trace["response_mask"].values.astype(bool)
    n, width = trace.sizes["sequence"], trace.sizes["position"]
    result = {k: np.full((n, width), -1 if k == "trainer_token_rank" else np.nan,
                         dtype=np.int64 if k == "trainer_token_rank" else np.float64) for k in TOKEN_TRAINER_VARS}
    latest_arrays: dict[str, np.ndarray] = {}
    base: xr.Dataset | None = None
    names: dict[str, str] = {}
    first: Scorer | None = None
    t0 = time.perf_counter()
    order = ([latest_v] if latest_v is not None else []) + [v for v in versions if v != latest_v]
    for v in order:
        sc = scorer(v)
        names[str(v)] = sc.model_name
        if v == latest_v:
            rows = np.arange(n)
        else:
            rows = np.flatnonzero(((pv == v) & mask).any(axis=1))
        scored = sc.score(trace.isel(sequence=rows))
        if base is None:
            base, first = scored, sc
        if v == latest_v:
            latest_arrays = {dst: scored[src].values for src, dst in LATEST_VARS.items()}
        if v in versions:
            own = (pv[rows] == v) & mask[rows]
            for k in TOKEN_TRAINER_VARS:
                block = result[k][rows]
                block[own] = scored[k].values[own]
                result[k][rows] = block
        del sc
    assert base is not None
    out = trace.copy()
    for k, arr in {**result, **latest_arrays}.items():
        out[k] = (TOKEN_DIMS, arr)
    if "trainer_prompt_token_id" in base and base.sizes["sequence"] == n:
        out["trainer_prompt_token_id"] = base["trainer_prompt_token_id"]
        out["trainer_prompt_length"] = base["trainer_prompt_length"]
    elif first is not None and first.tokenize_prompts:
        out = tokenize_prompts(out, first.tokenizer, add_special_tokens=first.add_special_tokens)
    trainer_attrs = dict(base.attrs.get("trainer", {}))
    trainer_attrs.update({"model": names.get(str(latest_v), next(iter(names.values()))),
                          "scored_by": "policy_version", "per_version": names, "latest_version": latest_v,
                          "score_s": round(time.perf_counter() - t0, 3)})
    out.attrs.update({"trainer": trainer_attrs, "scored_token_checksum": token_checksum(trace)})
    return validate(annotate(out))


def score(trace: xr.Dataset, model: str | os.PathLike | None = None, *, dtype: str = "float32",
          head_dtype: str = "float32", device: str = "cpu", **kwargs: Any) -> xr.Dataset:
    """Rescore ``trace`` with the trainer (``model`` defaults to the trace's own model)."""
    model = model or trace.attrs.get("model")
    if not model:
        raise ValueError("the trace names no model: pass model=PATH_OR_HUB_ID")
    return Scorer(model, dtype=dtype, head_dtype=head_dtype, device=device, **kwargs).score(trace)
