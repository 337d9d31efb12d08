"""How the trainer batches a trace for its forwards: which sequences share a micro-batch
(:func:`micro_batches`), the rows of one body forward (right-padded rows, one packed row, left-padded
rows, or alone at a fixed bucket length) and the hidden states read back from them
(:func:`response_hidden`), the LM head's inputs for a micro-batch's response tokens
(:func:`head_rows`) and its statistics put back per sequence (:func:`scatter`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BUCKET", "HeadRows", "VARLEN_ATTENTION", "head_rows", "micro_batches", "response_hidden", "scatter"]

BUCKET = 64  # batch-invariant mode pads every sequence to a multiple of this many tokens
# transformers' attention implementations that read a packed row's sequences from its position ids alone:
# FlexAttention builds a block-sparse document mask (the blocks between sequences are skipped), the
# FlashAttention kernels run variable-length attention; a packed row costs no masked FLOPs there
VARLEN_ATTENTION = ("flex_attention", "flash_attention_2", "flash_attention_3")


def micro_batches(seqs: list[tuple[list[int], list[int]]], order: str, size: int) -> Iterator[list[int]]:
    """The indices into ``seqs`` of each micro-batch of ``size`` sequences.

    Parameters
    ----------
    seqs : list of (list of int, list of int)
        ``(prompt ids, response ids)`` per sequence.
    order : {"length", "shuffled", "given"}
        Similar lengths together, shuffled (seeded), or the trace's order.
    size : int
        Sequences per micro-batch.

    Yields
    ------
    list of int
        The indices of one micro-batch.
    """
    n = len(seqs)
    if order == "length":
        ordered = sorted(range(n), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
    elif order == "shuffled":
        ordered = [int(i) for i in np.random.default_rng(0).permutation(n)]
    else:
        ordered = list(range(n))
    for s in range(0, n, size):
        yield ordered[s: s + size]


def response_hidden(decoder: Any, seqs: list[tuple[list[int], list[int]]], batch: list[int], device: str,
                    layout: str, batch_invariant: bool) -> list:
    """One forward of ``decoder`` over the sequences ``batch`` of ``seqs``, laid out as ``layout`` says.

    Parameters
    ----------
    decoder : torch.nn.Module
        The model's body (its ``last_hidden_state`` is read).
    seqs : list of (list of int, list of int)
        ``(prompt ids, response ids)`` per sequence.
    batch : list of int
        Indices into ``seqs`` of this forward's sequences.
    device : str
        Where the forward runs.
    layout : str
        ``"packed"`` (one row, a block-diagonal causal mask), ``"left_padded"`` or right-padded rows.
    batch_invariant : bool
        Each row alone at a bucket length (right-padded), whatever ``layout`` says.

    Returns
    -------
    list of torch.Tensor
        Per sequence of ``batch``, the hidden states ``(rlen, H)`` at the positions that predict its
        response tokens.
    """
    full = [seqs[i][0] + seqs[i][1] for i in batch]
    starts = [len(seqs[i][0]) - 1 for i in batch]
    rlens = [len(seqs[i][1]) for i in batch]
    if layout == "packed" and not batch_invariant:
        return _packed(decoder, full, starts, rlens, device)
    return _padded(decoder, full, starts, rlens, device, left=layout == "left_padded" and not batch_invariant,
                   bucket=batch_invariant)


def token_starts(lengths: list[int], layout: str, batch_invariant: bool) -> tuple[int, list[int]]:
    """Where each sequence of one forward sits among its input tokens, as :func:`response_hidden` lays them out.

    Parameters
    ----------
    lengths : list of int
        The sequences' lengths (prompt and response), in the batch's order.
    layout : str
        ``"packed"``, ``"left_padded"`` or right-padded.
    batch_invariant : bool
        Rows alone at a bucket length (the layout is then right-padded).

    Returns
    -------
    tuple of (int, list of int)
        The forward's input tokens (rows x width, row-major, as a MoE router sees them) and, per
        sequence, the index of its first token among them.
    """
    if layout == "packed" and not batch_invariant:
        return sum(lengths), [int(x) for x in np.cumsum([0] + lengths[:-1])]
    width = max(lengths)
    if batch_invariant:
        width = -(-width // BUCKET) * BUCKET
    left = layout == "left_padded" and not batch_invariant
    return len(lengths) * width, [r * width + (width - n if left else 0) for r, n in enumerate(lengths)]


def _packed(decoder: Any, full: list[list[int]], starts: list[int], rlens: list[int], dev: str) -> list:
    """One row of the sequences back to back: position ids reset at each, a block-diagonal causal mask (a
    dense one, or the attention implementation's own from the position ids: :data:`VARLEN_ATTENTION`)."""
    import torch

    ids = torch.tensor([t for f in full for t in f], dtype=torch.long)[None]
    pos = torch.cat([torch.arange(len(f)) for f in full])[None]
    if getattr(getattr(decoder, "config", None), "_attn_implementation", None) in VARLEN_ATTENTION:
        # no mask and no cache: transformers finds the sequences where the position ids restart
        hidden = decoder(input_ids=ids.to(dev), position_ids=pos.to(dev), use_cache=False).last_hidden_state[0]
    else:
        doc = torch.cat([torch.full((len(f),), k) for k, f in enumerate(full)]).to(dev)
        at = torch.arange(ids.shape[1], device=dev)  # the L x L mask is made where it is used
        mask = ((doc[:, None] == doc[None, :]) & (at[:, None] >= at[None, :]))[None, None]
        hidden = decoder(input_ids=ids.to(dev), position_ids=pos.to(dev), attention_mask=mask).last_hidden_state[0]
    offsets = np.cumsum([0] + [len(f) for f in full[:-1]])
    return [hidden[o + s: o + s + r] for o, s, r in zip(offsets, starts, rlens)]


def _padded(decoder: Any, full: list[list[int]], starts: list[int], rlens: list[int], dev: str, *, left: bool,
            bucket: bool) -> list:
    """One padded row per sequence with an attention mask: right-padded, or left-padded (``left``); with
    ``bucket`` the width is rounded up to :data:`BUCKET` tokens."""
    import torch

    L = max(len(f) for f in full)
    if bucket:
        L = -(-L // BUCKET) * BUCKET  # a fixed bucket: the shape depends on this sequence alone
    ids = torch.zeros((len(full), L), dtype=torch.long)
    att = torch.zeros((len(full), L), dtype=torch.long)
    shift = [L - len(f) if left else 0 for f in full]
    for r, f in enumerate(full):
        ids[r, shift[r]: shift[r] + len(f)] = torch.tensor(f)
        att[r, shift[r]: shift[r] + len(f)] = 1
    hidden = decoder(input_ids=ids.to(dev), attention_mask=att.to(dev)).last_hidden_state
    return [hidden[r, shift[r] + s: shift[r] + s + n] for r, (s, n) in enumerate(zip(starts, rlens))]


@dataclass
class HeadRows:
    """The LM head's inputs for one micro-batch's response tokens, sequence after sequence.

    Parameters
    ----------
    hidden : torch.Tensor
        ``(tokens, H)`` hidden states.
    tokens : torch.Tensor
        ``(tokens,)`` sampled ids.
    temperature : torch.Tensor
        ``(tokens,)``: each token's sequence's trainer temperature.
    top_k : torch.Tensor
        ``(tokens,)`` top-k per token.
    top_p : torch.Tensor
        ``(tokens,)`` top-p per token.
    where : list of (int, int)
        ``(sequence index, response length)`` in row order.
    """

    hidden: Any  # (tokens, H) hidden states
    tokens: Any  # (tokens,) sampled ids
    temperature: Any  # (tokens,) per token, its sequence's
    top_k: Any
    top_p: Any
    where: list[tuple[int, int]]  # (sequence index, response length) in row order


def head_rows(hidden: list, seqs: list[tuple[list[int], list[int]]], batch: list[int],
              sampling: dict[str, np.ndarray], device: str) -> HeadRows | None:
    """The head's inputs for the response tokens of ``batch``.

    Parameters
    ----------
    hidden : list of torch.Tensor
        :func:`response_hidden`'s hidden states, one ``(rlen, H)`` per sequence of ``batch``.
    seqs : list of (list of int, list of int)
        ``(prompt ids, response ids)`` per sequence.
    batch : list of int
        Indices into ``seqs``.
    sampling : dict of str to numpy.ndarray
        Per sequence ``trainer_temperature``, ``trainer_top_k`` and ``trainer_top_p``.
    device : str
        Where the head runs.

    Returns
    -------
    HeadRows or None
        The rows, each sequence's sampling on its tokens; ``None`` when every response of the batch is
        empty.
    """
    import torch

    temp, topk, topp = (sampling[k] for k in ("trainer_temperature", "trainer_top_k", "trainer_top_p"))
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
        return None
    return HeadRows(torch.cat(rows), torch.cat(toks).to(device), torch.cat(tt).to(device), torch.cat(tk).to(device),
                    torch.cat(tp).to(device), where)


def scatter(stats: dict[str, Any], where: list[tuple[int, int]], result: dict[str, np.ndarray]) -> None:
    """Put the head's per-token statistics back into the ``(sequence, position)`` arrays of ``result``.

    Parameters
    ----------
    stats : dict of str to numpy.ndarray
        Per-token statistics, sequence after sequence.
    where : list of (int, int)
        ``(sequence index, response length)`` in the row order of ``stats`` (:attr:`HeadRows.where`).
    result : dict of str to numpy.ndarray
        ``(sequence, position)`` arrays, filled in place.
    """
    off = 0
    for i, rlen in where:
        for k, v in stats.items():
            result[k][i, :rlen] = v[off: off + rlen]
        off += rlen
