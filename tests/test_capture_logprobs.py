"""Reading the sampled tokens' logprobs out of vLLM's outputs (no engine: vLLM's own containers, filled as its
output processor fills them)."""

from __future__ import annotations

import pytest

from rlparity.capture.offline import sampled_logprobs


def _positions(token_ids, topk: int):
    """Per position, vLLM's entries: the sampled token first, then the top ``topk`` (one may be the sampled one)."""
    out = []
    for i, t in enumerate(token_ids):
        top = [(100 + j, -0.5 - j - 0.01 * i) for j in range(topk)]
        out.append([(t, -1.25 - 0.125 * i), *top])
    return out


@pytest.mark.parametrize("topk", [0, 2])
def test_flat_logprobs_give_the_dict_forms_sampled_logprobs(topk):
    logprobs_mod = pytest.importorskip("vllm.logprobs")
    token_ids = [7, 100, 9, 7]  # 100 is also a top-k entry at position 1 (in the dict, one key)
    flat, dicts = logprobs_mod.FlatLogprobs(), []
    for pos in _positions(token_ids, topk):
        flat.append_fast([t for t, _ in pos], [v for _, v in pos], iter(range(1, len(pos) + 1)), [None] * len(pos))
        d = {}
        for rank, (t, v) in enumerate(pos, 1):
            d.setdefault(t, logprobs_mod.Logprob(logprob=v, rank=rank))
        dicts.append(d)
    expected = [-1.25 - 0.125 * i for i in range(len(token_ids))]  # by hand: the sampled entry of each position
    assert sampled_logprobs(flat, token_ids) == expected
    assert sampled_logprobs(dicts, token_ids) == expected
    assert sampled_logprobs(flat, tuple(token_ids)) == expected  # vLLM's token ids need not be a list


def test_flat_logprobs_of_another_token_are_refused():
    logprobs_mod = pytest.importorskip("vllm.logprobs")
    flat = logprobs_mod.FlatLogprobs()
    flat.append_fast([5], [-1.0], iter([1]), [None])
    with pytest.raises(RuntimeError, match="sampled token"):
        sampled_logprobs(flat, [6])


def test_a_container_longer_than_the_tokens_gives_one_logprob_per_token_as_the_dict_form():
    logprobs_mod = pytest.importorskip("vllm.logprobs")
    flat = logprobs_mod.FlatLogprobs()
    for t, v in ((5, -1.0), (6, -2.0), (7, -3.0)):
        flat.append_fast([t], [v], iter([1]), [None])
    dicts = [{t: logprobs_mod.Logprob(logprob=v, rank=1)} for t, v in ((5, -1.0), (6, -2.0), (7, -3.0))]
    assert sampled_logprobs(flat, [5, 6]) == sampled_logprobs(dicts, [5, 6]) == [-1.0, -2.0]
