"""Experiment factors as coordinates (issue 23): recorded in each arm's attrs, assembled into dims,
selected with ``.sel``; the shipped stores (written before factors were recorded) read through the
one legacy fallback."""

import numpy as np
import pytest

from rlparity.datasets import load_example
from rlparity.metrics import head_precision as H
from rlparity.metrics import inflight as mi
from rlparity.metrics import rl as mrl
from rlparity.testing import synthetic_trace
from rlparity.trace import arm_factors, by_factors, factors, open_arms, save, stack_cells, with_factors


def test_shipped_inflight_store_selects_by_coordinate():
    arms = load_example("h200-inflight")
    assert all("factors" in ds.attrs for ds in arms.values())  # re-saved with its factors (issue 35)
    lp = by_factors(arms, "rollout_logprob")
    # the factors in the order a store reads them back (its consolidated metadata sorts keys), as for
    # any store saved since factors are recorded
    assert lp.dims[:3] == ("clear_cache", "mode", "prefix_caching")
    assert lp["mode"].values.tolist() == ["abort", "keep", "wait"]
    cell = lp.sel(mode="keep", clear_cache=False, prefix_caching=True)
    assert cell["arm"].item() == "keep-noclear-prefix_on"
    ds = arms["keep-noclear-prefix_on"]
    n, m = ds.sizes["sequence"], ds.sizes["position"]
    np.testing.assert_array_equal(cell.values[:n, :m], ds["rollout_logprob"].values)
    # every arm is one cell: 3 modes x 2 x 2
    assert sorted(lp["arm"].values.ravel().tolist()) == sorted(arms)


def test_shipped_head_and_rl_stores_give_their_factors():
    head = factors(load_example("h200-head"))
    assert set(head.coords) == {"arm", "rollout_head", "trainer_head"}
    assert head.sel(arm="rollout-float32_trainer-bfloat16")["rollout_head"].item() == "float32"
    rl = by_factors(load_example("h200-rl"), lambda ds: ds["reward"].mean())
    assert rl["reward"].dims == ("old_policy", "profile", "step")
    assert rl["step"].values.tolist() == [0, 99] and rl["old_policy"].values.tolist() == ["mu", "pi_old"]
    got = float(rl["reward"].sel(profile="vllm-v1-defaults", old_policy="mu", step=99))
    want = float(load_example("h200-rl", "vllm-v1-defaults+mu@step_099")["reward"].mean())
    assert got == want


def test_recorded_factors_win_over_the_label_and_survive_a_store(tmp_path):
    ds = with_factors(synthetic_trace(6, 5, arm="whatever"), mode="wait", clear_cache=True, prefix_caching=False)
    ds2 = with_factors(synthetic_trace(6, 5, arm="rollout-float32_trainer-float32", seed=1), mode="keep",
                       clear_cache=True, prefix_caching=False)
    back = open_arms(save({"whatever": ds, "rollout-float32_trainer-float32": ds2}, tmp_path / "s.zarr"))
    assert arm_factors(back["whatever"]) == {"mode": "wait", "clear_cache": True, "prefix_caching": False}
    # the label reads like a head cell, the recorded factors say inflight: the factors win
    assert arm_factors(back["rollout-float32_trainer-float32"])["mode"] == "keep"
    table = mi.inflight_table(back)
    assert mi.is_inflight(back) and table["mode"].sel(arm="whatever").item() == "wait"
    assert table["mode"].sel(arm="rollout-float32_trainer-float32").item() == "keep"
    with pytest.raises(TypeError, match="str, int, float or bool"):
        with_factors(ds, mode=["keep"])


def test_two_arms_of_one_cell_and_arms_without_factors_are_errors():
    a = with_factors(synthetic_trace(4, 4, arm="a"), rollout_head="float32", trainer_head="float32")
    b = with_factors(synthetic_trace(4, 4, arm="b"), rollout_head="float32", trainer_head="float32")
    with pytest.raises(ValueError, match="same cell"):
        by_factors({"a": a, "b": b}, "rollout_logprob")
    with pytest.raises(ValueError, match="share no factor"):
        by_factors({"x": synthetic_trace(4, 4, arm="x")})
    with pytest.raises(ValueError, match="records no factor mode"):
        factors({"a": a}, dims=["mode"])


def test_a_missing_cell_is_nan_and_its_arm_empty():
    cells = {("bfloat16", "float32"): synthetic_trace(4, 4, seed=0)["rollout_logprob"].mean(),
             ("float32", "bfloat16"): synthetic_trace(4, 4, seed=1)["rollout_logprob"].mean()}
    grid = stack_cells(cells, H.CELL_DIMS)
    assert grid["rollout_logprob"].shape == (2, 2)
    assert np.isnan(float(grid["rollout_logprob"].sel(rollout_head="float32", trainer_head="float32")))


def test_the_arm_name_is_never_read_for_factors():
    """Factors come from ``attrs["factors"]``, or from an old store's own head-matrix / inflight record
    (converted on read), never from the arm name (issue 35 dropped ``trace/legacy.py``): an arm named
    like an old cell has no factors; recorded factors win over an old record; no module of the package
    parses a cell out of a name."""
    from pathlib import Path

    import rlparity

    old_names = {"rollout-float32_trainer-bfloat16": ({"head_experiment": {"rollout_head": "fp32", "trainer_head": "bf16"}},
                                                      {"rollout_head": "float32", "trainer_head": "bfloat16"}),
                 "keep-noclear-prefix_on": ({"inflight": {"mode": "keep", "clear_cache": 0, "prefix_caching": 1}},
                                            {"mode": "keep", "clear_cache": False, "prefix_caching": True}),
                 "vllm-v1-defaults+mu@step_007": ({"rl": {"profile": "vllm-v1-defaults", "old_policy": "mu"}}, {})}
    for name, (record, converted) in old_names.items():
        tr = synthetic_trace(4, 4, arm=name)
        assert arm_factors(tr) == {}, name  # the name alone says nothing
        tr.attrs.update(record)
        assert arm_factors(tr) == converted, name
        assert arm_factors(with_factors(tr, step=7)) == {"step": 7}
    tr = synthetic_trace(4, 4, arm="x")
    tr.attrs["head_experiment"] = {"rollout_head": "float64", "trainer_head": "bf16"}  # not a head dtype: no cell
    assert arm_factors(tr) == {}
    root = Path(rlparity.__file__).parent
    hits = [str(p.relative_to(root)) for p in root.rglob("*.py")
            if any(pat in p.read_text() for pat in ("@step_(", "prefix_(?P", "_trainer-(?P", 'split("+")'))]
    assert hits == []


def test_every_shipped_example_of_an_experiment_records_its_factors():
    """The shipped stores of the factor experiments were re-saved with their factors (issue 35): every
    arm of the head matrices, the inflight matrix and the RL run records its cell."""
    from rlparity.datasets import example_path
    from rlparity.trace import as_arms

    want = {"cpu-head": set(H.CELL_DIMS), "h200-head": set(H.CELL_DIMS), "h200-inflight": set(mi.CELL_FACTORS),
            "h200-rl": set(mrl.STEP_FACTORS)}
    for name, dims in want.items():
        arms = as_arms(example_path(name))
        assert arms and all(set(arm_factors(ds)) == dims for ds in arms.values()), name
    cells = factors(as_arms(example_path("h200-inflight")))
    assert {(m, bool(c), bool(p)) for m, c, p in zip(cells["mode"].values, cells["clear_cache"].values,
                                                     cells["prefix_caching"].values)} == {
        (m, c, p) for m in ("keep", "wait", "abort") for c in (False, True) for p in (False, True)}


def test_head_matrix_records_each_cells_factors():
    """The runner stamps the factors at capture time (a stand-in pool and scorers: no engine)."""
    torch = pytest.importorskip("torch")
    from rlparity.experiments.head_precision import head_matrix

    class Engine:
        def __init__(self, settings):
            self.settings = settings

        def capture(self, prompts, sampling, arm, progress):
            ds = synthetic_trace(4, 4, arm=arm)
            ds.attrs["engine_effective"] = {**ds.attrs["engine_effective"], "head_dtype": self.settings.head_dtype,
                                            "dtype": self.settings.dtype}
            return ds

    class Pool:
        def get(self, model, settings):
            return Engine(settings)

    class Scorer:
        def __init__(self, head):
            self.dtype, self.head_dtype = "bfloat16", head
            self.module = torch.nn.Linear(2, 2).to(torch.bfloat16)
            self.head_weight = torch.zeros(2, 2, dtype=getattr(torch, head))

        def score(self, rollout):
            return rollout.copy()

    heads = ("bfloat16", "float32")
    arms = head_matrix("/nonexistent/model", ["1+1="], pool=Pool(), scorers={h: Scorer(h) for h in heads})
    assert {name: ds.attrs["factors"] for name, ds in arms.items()} == {
        H.arm_name(r, t): {"rollout_head": r, "trainer_head": t} for r in heads for t in heads}
    assert by_factors(arms, "rollout_logprob").sel(rollout_head="float32", trainer_head="bfloat16")["arm"].item() == \
        "rollout-float32_trainer-bfloat16"
