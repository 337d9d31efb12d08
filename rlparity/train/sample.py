"""Sampling with transformers ``generate``: a rollout trace without vLLM (fast, for tests and CPU
demos). The rollout logprob mu is the log-softmax of ``generate``'s processed scores
(temperature, top-k, top-p applied as warpers): the processed reading, from the same weights and
precision as the trainer, so mu = pi_old up to the KV-cache numerics."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace import from_rollouts


def generate_trace(model: Any, prompts: Sequence[str], *, n: int = 4, temperature: float = 0.7, top_k: int = 20,
                   top_p: float = 1.0, max_new_tokens: int = 16, seed: int = 0, tokenizer: Any = None,
                   device: str = "cpu", arm: str = "generate") -> xr.Dataset:
    """Sample ``n`` responses per prompt with transformers ``model.generate``: a rollout trace without vLLM.

    A response ends at the EOS token (kept) or after ``max_new_tokens``. Sampling is seeded per
    prompt (``seed + prompt index``). The rollout logprob is the log-softmax of ``generate``'s
    processed scores (temperature, top-k, top-p applied).

    Parameters
    ----------
    model : str, os.PathLike or transformers model
        A path / hub id (loaded in float32 onto ``device``) or a loaded causal LM.
    prompts : sequence of str
        The prompt texts.
    n : int, default 4
        Samples per prompt.
    temperature : float, default 0.7
        Sampling temperature.
    top_k : int, default 20
        Top-k truncation.
    top_p : float, default 1.0
        Top-p (nucleus) truncation; 1.0 keeps every token.
    max_new_tokens : int, default 16
        The longest response, in tokens.
    seed : int, default 0
        Base seed; prompt ``i`` is sampled with ``seed + i``.
    tokenizer : transformers tokenizer, optional
        Defaults to the tokenizer loaded from the model's path.
    device : str, default "cpu"
        Torch device a model given by path is moved to; the prompts are put there too.
    arm : str, default "generate"
        The ``arm`` attribute of the trace.

    Returns
    -------
    xarray.Dataset
        A rollout trace (:func:`rlparity.trace.from_rollouts`) with ``prompt_index`` /
        ``sample_index`` grouping, the prompt and response texts and the sampling settings in its
        attributes; rollout logprobs in nats.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(model, (str, os.PathLike)):
        path = str(model)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    else:
        path = str(getattr(model, "name_or_path", ""))
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
    model.eval()
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    p_ids, toks, lps, finish, pidx, sidx, ptexts, rtexts = ([] for _ in range(8))
    for i, prompt in enumerate(prompts):
        enc = tokenizer(prompt, return_tensors="pt").to(device)
        plen = enc["input_ids"].shape[1]
        torch.manual_seed(seed + i)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p,
                                 max_new_tokens=max_new_tokens, num_return_sequences=n, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=pad)
        logp = torch.stack(out.scores, dim=1).float().log_softmax(dim=-1)  # (n, steps, vocab)
        for j in range(n):
            gen = out.sequences[j, plen:].tolist()
            if eos in gen:
                gen = gen[: gen.index(eos) + 1]
                fin = "stop"
            else:
                fin = "length"
            lp = logp[j, torch.arange(len(gen)), torch.tensor(gen, dtype=torch.long)].double().tolist()
            p_ids.append(enc["input_ids"][0].tolist())
            toks.append(gen)
            lps.append(lp)
            finish.append(fin)
            pidx.append(i)
            sidx.append(j)
            ptexts.append(prompt)
            rtexts.append(tokenizer.decode(gen, skip_special_tokens=True))
    return from_rollouts(
        prompt_token_ids=p_ids, token_ids=toks, rollout_logprobs=lps, finish_reasons=finish,
        prompt_index=pidx, sample_index=sidx, temperature=temperature, top_k=top_k, top_p=top_p,
        request_seed=np.asarray(pidx) + seed, prompt_texts=ptexts, response_texts=rtexts,
        attrs={"arm": arm, "capture_backend": "transformers.generate", "model": path,
               "engine_effective": {"logprobs_mode": "processed_logprobs", "dtype": str(model.dtype).removeprefix("torch."),
                                    "head_dtype": str(model.dtype).removeprefix("torch.")},
               "engine_requested": {"logprobs_mode": "processed_logprobs"},
               "sampling": {"n": n, "temperature": temperature, "top_k": top_k, "top_p": top_p,
                            "max_new_tokens": max_new_tokens, "seed": seed}})


__all__ = ["generate_trace"]
