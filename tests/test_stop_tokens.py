"""The stop-token topic (rlparity.diagnose.stop_tokens), against counts made by hand in plain Python."""

from __future__ import annotations

import numpy as np

from rlparity.diagnose import diagnose
from rlparity.diagnose.stop_tokens import stop_ids, stop_token_parity
from rlparity.testing import synthetic_trace
from rlparity.trace.schema import token_checksum

EOS = 31


def _with_stops(n_stop: int, inside: dict[int, int], seed: int = 0, last_ids=None):
    """A synthetic arm whose first ``n_stop`` responses end with EOS (finish ``stop``) and whose
    sequence ``i`` in ``inside`` holds EOS at position ``inside[i]`` (before its end)."""
    tr = synthetic_trace(n_sequences=12, max_len=16, vocab=32, seed=seed, arm="stops")
    tok = tr["token_id"].values.copy()
    tok[tok == EOS] = 0  # EOS only where placed below
    mask = tr["response_mask"].values.astype(bool)
    lengths = mask.sum(axis=1)
    finish = np.array(["length"] * tok.shape[0], dtype=object)
    for i in range(n_stop):
        tok[i, lengths[i] - 1] = EOS if last_ids is None else last_ids[i]
        finish[i] = "stop"
    for i, pos in inside.items():
        tok[i, pos] = EOS
    out = tr.assign(token_id=(tr["token_id"].dims, tok), finish_reason=(tr["finish_reason"].dims, finish.astype(str)))
    # the synthetic trainer scored these very tokens: record it, as a rescoring does
    return out.assign_attrs(scored_token_checksum=token_checksum(out))


def _by_hand(tr):
    """Responses with EOS strictly before their last token, counted with lists."""
    rows = []
    for i, (toks, m) in enumerate(zip(tr["token_id"].values.tolist(), tr["response_mask"].values.tolist())):
        real = [t for t, k in zip(toks, m) if k]
        if EOS in real[:-1]:
            rows.append(i)
    return rows


def test_a_response_that_runs_past_the_engines_stop_id_is_a_warning_naming_it():
    tr = _with_stops(5, {7: 3, 9: 1})
    assert stop_ids(tr) == ([EOS], 5)
    f = stop_token_parity(tr)
    assert f.name == "stop_token_inside_response" and f.severity.value == "warning"
    assert f.evidence["sequences"] == _by_hand(tr) == [7, 9]
    assert f.evidence["first_positions"] == [3, 1] and f.evidence["n_tokens_inside"] == 2
    assert "2 of 12 responses" in f.summary
    report = diagnose(tr)  # found by the diagnosis through its topic, at its place in the method
    assert "stop_token_inside_response" in report.names()


def test_consistent_stops_are_information_and_too_few_or_too_varied_ends_say_nothing():
    ok = stop_token_parity(_with_stops(5, {}))
    assert ok.name == "stop_tokens_consistent" and ok.severity.value == "info"
    assert stop_token_parity(_with_stops(3, {7: 3})) is None  # 3 `stop` responses: below STOP_MIN_SEQUENCES
    varied = _with_stops(6, {7: 3}, last_ids=[3, 5, 8, 11, 13, 17])  # stop strings end on ordinary tokens
    assert stop_ids(varied) == ([], 6) and stop_token_parity(varied) is None
    # the last token itself is not "inside": a stop response ends with EOS and is not counted
    assert _by_hand(_with_stops(5, {})) == [] and stop_token_parity(_with_stops(5, {})).evidence[
        "n_responses_past_a_stop_id"] == 0
    # two stop ids that together end 90% of the stop responses are both watched
    two = _with_stops(10, {8: 2}, last_ids=[EOS] * 6 + [30] * 4)
    two_ids, _ = stop_ids(two)
    assert sorted(two_ids) == [30, EOS]


def test_the_stop_ids_at_their_edges():
    """Edges the mutation run found untested: the minimum count, the cover reached exactly, three ids,
    an empty response, a stop id just before the last token, a trace without finish reasons."""
    assert stop_ids(_with_stops(5, {}).drop_vars("finish_reason")) == ([], 0)
    assert stop_token_parity(_with_stops(4, {})).name == "stop_tokens_consistent"  # exactly STOP_MIN_SEQUENCES
    # 8 of 10 end with EOS: 80% < 90%, so the next id joins; 9 of 10 then reach the cover exactly
    assert stop_ids(_with_stops(10, {}, last_ids=[EOS] * 8 + [30, 29]))[0] == [EOS, 30]
    assert stop_ids(_with_stops(10, {}, last_ids=[EOS] * 4 + [30] * 3 + [29] * 3))[0] == [EOS, 30, 29]  # three: kept
    assert stop_ids(_with_stops(10, {}, last_ids=[EOS] * 4 + [30] * 2 + [29] * 2 + [28] * 2))[0] == []  # four: none
    # a stop id on the token before the last one is inside the response
    tr = _with_stops(5, {})
    lengths = tr["response_mask"].values.sum(axis=1)
    tok = tr["token_id"].values.copy()
    tok[8, lengths[8] - 2] = EOS
    tr = tr.assign(token_id=(tr["token_id"].dims, tok))
    f = stop_token_parity(tr.assign_attrs(scored_token_checksum=token_checksum(tr)))
    assert f.name == "stop_token_inside_response" and f.evidence["first_positions"] == [int(lengths[8]) - 2]
    # an empty response is neither a stop response nor a response
    tr = _with_stops(5, {})
    mask = tr["response_mask"].values.copy()
    mask[0] = False
    tr = tr.assign(response_mask=(tr["response_mask"].dims, mask))
    assert stop_ids(tr) == ([EOS], 4)
    assert stop_token_parity(tr).evidence["n_responses"] == 11


def test_a_one_token_response_that_is_the_stop_id_counts():
    tr = _with_stops(5, {})
    mask, tok = tr["response_mask"].values.copy(), tr["token_id"].values.copy()
    mask[0] = False
    mask[0, 0] = True
    tok[0, 0] = EOS  # the engine stopped at once
    tr = tr.assign(response_mask=(tr["response_mask"].dims, mask), token_id=(tr["token_id"].dims, tok))
    assert stop_ids(tr) == ([EOS], 5)
    assert stop_token_parity(tr).evidence["n_responses"] == 12
