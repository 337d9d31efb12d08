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
