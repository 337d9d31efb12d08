"""The trainer's per-layer states on the same tokens as a layer capture of the engine.

:func:`trainer_layer_states` runs each prompt + response through the trainer's model (one forward
per sequence, no padding) with the same hooks as the engine's worker
(:class:`rlparity.trace.layers.SiteHooks`, sites in the order of
:func:`rlparity.trace.layers.sites`) and computes the logits at the same vocabulary columns with
the trainer's LM head in its ``head_dtype`` (:func:`rlparity.score.lm_head_stats.project`, as the scorer
does). States come back as float32 numpy arrays, one sequence at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from rlparity.score.lm_head_stats import project
from rlparity.trace.layers import SiteHooks, decoder_stack, site_modules


def trainer_layer_states(scorer: Any, sequences: Sequence[Sequence[int]], *, vocab_ids: Sequence[int]
                         ) -> Iterator[dict[str, Any]]:
    """The trainer's per-site states and logits on the tokens of each sequence.

    One forward per sequence (no padding) with the engine worker's hooks; the logits at
    ``vocab_ids`` come from the scorer's LM head in its ``head_dtype``.

    Parameters
    ----------
    scorer : rlparity.score.Scorer
        A :class:`~rlparity.score.Scorer` (its model, head, ``head_dtype`` and ``fp32_gemm``).
    sequences : sequence of sequence of int
        The token ids of each prompt + response.
    vocab_ids : sequence of int
        The vocabulary columns whose logits to compute (the layer capture's).

    Yields
    ------
    dict
        Per sequence ``{"states": (n_sites - 1, L, H), "logits": (L, len(vocab_ids)), "length": L}``,
        float32 numpy arrays.

    Raises
    ------
    RuntimeError
        If the hooks did not see every site.
    """
    import torch

    module = scorer.module
    stack = decoder_stack(module)
    n_sites = len(site_modules(stack))
    cols = torch.tensor([int(i) for i in vocab_ids], dtype=torch.long, device=scorer.head_weight.device)
    w = scorer.head_weight.index_select(0, cols)
    b = scorer.head_bias.index_select(0, cols) if scorer.head_bias is not None else None
    hooks = SiteHooks(stack)
    try:
        for seq in sequences:
            ids = torch.tensor([[int(t) for t in seq]], dtype=torch.long, device=scorer.device)
            hooks.calls = []
            with torch.no_grad():
                scorer.decoder(input_ids=ids, attention_mask=torch.ones_like(ids))
                call = hooks.calls[-1]
                if len(call["sites"]) != n_sites:
                    raise RuntimeError(f"the trainer's hooks saw {len(call['sites'])} of {n_sites} sites")
                states = np.stack([call["sites"][k][0].float().cpu().numpy() for k in range(n_sites)])
                final = call["sites"][n_sites - 1][0]
                logits = project(final, w, b, scorer.head_dtype, scorer.fp32_gemm).cpu().numpy()
            yield {"states": states, "logits": logits.astype(np.float32), "length": len(seq)}
    finally:
        hooks.remove()


__all__ = ["trainer_layer_states"]
