"""Trace data model: construction, validation errors, zarr round trip (synthetic, no engine)."""

import numpy as np
import pytest
import xarray as xr

from rlparity import trace as T
from rlparity.testing import synthetic_trace


def test_round_trip_several_arms(tmp_path):
    a = synthetic_trace(arm="a", seed=1)
    b = synthetic_trace(arm="b", seed=2, logprobs_mode="raw_logprobs")
    path = T.save({"a": a, "b": b}, tmp_path / "exp.zarr")
    arms = T.open_arms(path)
    assert list(arms) == ["a", "b"]
    for name, orig in (("a", a), ("b", b)):
        got = arms[name]
        for v in orig.data_vars:
            np.testing.assert_array_equal(got[v].values, orig[v].values)
        assert got.attrs["engine_effective"] == orig.attrs["engine_effective"]
        assert got["rollout_logprob"].attrs["units"] == "nats"
    with pytest.raises(ValueError, match="pass arm"):
        T.load(path)
    assert T.load(path, "b").attrs["arm"] == "b"


def test_add_arm_keeps_others(tmp_path):
    p = tmp_path / "s.zarr"
    T.add_arm(synthetic_trace(seed=1), p, "x")
    T.add_arm(synthetic_trace(seed=2), p, "y")
    assert set(T.open_arms(p)) == {"x", "y"}


def test_missing_variable_is_named():
    ds = synthetic_trace().drop_vars("rollout_logprob")
    with pytest.raises(T.TraceValidationError, match="rollout_logprob"):
        T.validate(ds)


def test_misaligned_lengths_are_caught():
    ds = synthetic_trace()
    ds["response_length"].values[0] += 3
    with pytest.raises(T.TraceValidationError, match="misaligned"):
        T.validate(ds)


def test_token_ids_differ_between_rollout_and_trainer():
    ds = synthetic_trace()
    tok = ds["token_id"].values.copy()
    tok[0, 0] = (tok[0, 0] + 1) % 30
    ds["token_id"] = (("sequence", "position"), tok)
    with pytest.raises(T.TraceValidationError, match="token ids differ"):
        T.validate(ds)


def test_from_rollouts_rejects_length_mismatch():
    with pytest.raises(T.TraceValidationError, match="sequence 0: 2 tokens but 1"):
        T.from_rollouts(prompt_token_ids=[[1]], token_ids=[[3, 4]], rollout_logprobs=[[-0.1]])


def test_failed_write_keeps_old_store(tmp_path):
    p = tmp_path / "s.zarr"
    T.save(synthetic_trace(seed=1), p)
    bad = synthetic_trace(seed=2).drop_vars("token_id")
    with pytest.raises(T.TraceValidationError):
        T.save(bad, p)
    assert T.load(p).sizes["sequence"] == 16
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".")]


def test_loading_a_non_store_is_clear(tmp_path):
    (tmp_path / "junk.zarr").mkdir()
    with pytest.raises(T.TraceValidationError, match="not a readable"):
        T.open_experiment(tmp_path / "junk.zarr")


def test_policy_version_and_reward_have_room():
    ds = T.from_rollouts(prompt_token_ids=[[1, 2]], token_ids=[[5, 6, 7]],
                         rollout_logprobs=[[-0.1, -0.2, -0.3]], policy_versions=[[0, 0, 1]],
                         rewards=[1.0])
    assert ds["policy_version"].values[0].tolist() == [0, 0, 1]
    assert ds["reward"].item() == 1.0
    assert isinstance(ds, xr.Dataset)


def test_optional_columns_as_one_object_or_as_keywords():
    """from_rollouts' optional columns: RolloutColumns and keywords build the same trace; a keyword
    beside columns= replaces its field; an unknown column is named with the ones there are."""
    base = dict(prompt_token_ids=[[1, 2], [1]], token_ids=[[5, 6], [7]], rollout_logprobs=[[-0.1, -0.2], [-0.3]])
    cols = T.RolloutColumns(temperature=[0.7, 1.0], top_k=20, rewards=[1.0, 0.0], response_texts=["a", "b"])
    ds = T.from_rollouts(**base, columns=cols)
    kw = T.from_rollouts(**base, temperature=[0.7, 1.0], top_k=20, rewards=[1.0, 0.0], response_texts=["a", "b"])
    assert ds.drop_attrs().identical(kw.drop_attrs())
    assert ds["temperature"].values.tolist() == [0.7, 1.0] and ds["top_k"].values.tolist() == [20, 20]
    assert ds["top_p"].values.tolist() == [1.0, 1.0] and ds["cached_prompt_tokens"].values.tolist() == [-1, -1]
    assert T.from_rollouts(**base, columns=cols, top_k=5)["top_k"].values.tolist() == [5, 5]
    with pytest.raises(TypeError, match="'reward'; use one of the fields of RolloutColumns: finish_reasons"):
        T.from_rollouts(**base, reward=[1.0, 0.0])
