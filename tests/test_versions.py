"""The per-version floor model on arrays (:mod:`rlparity.metrics.versions`, issue 41): its bars and guards
at their exact values, on token arrays written out here.

Every ``|r|`` is a power of two or a small multiple of one, so medians, means and their ratios are exact in
binary and the expected values are read off by hand. Versions occupy whole sequences or named positions;
the jackknife deals the sequences (axis 0) into groups, one sequence a group here (fewer than 20).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from rlparity.config.defaults import defaults
from rlparity.metrics import versions as mv

VT = mv.VersionThresholds  # the bars of version_excess (None fields: the defaults)


def _tokens(rows):
    """``rows``: per sequence a list of ``(version, |r|)`` tokens (None: no free token there), padded.

    Returns ``(abs_residual, free, policy_version)``, each ``(sequence, position)``."""
    width = max(len(r) for r in rows)
    absr, free, pv = np.zeros((len(rows), width)), np.zeros((len(rows), width), bool), np.full((len(rows), width), -1)
    for i, row in enumerate(rows):
        for j, tok in enumerate(row):
            if tok is not None:
                pv[i, j], absr[i, j], free[i, j] = tok[0], tok[1], True
    return absr, free, pv


def test_a_later_version_flagged_at_exactly_the_ratio_bar():
    """Version 1's |r| is 1.0 on every token, version 0's 0.5: the ratio is exactly 2 in both statistics and
    without spread (z = +inf). A bar of 2 flags it (at least the ratio), a bar just above 2 does not."""
    absr, free, pv = _tokens([[(0, 0.5)] * 3] * 4 + [[(1, 1.0)] * 3] * 4)
    assert np.exp(np.log(1.0 / 0.5)) == 2.0  # the premise: the ratio survives its log and exp exactly
    ve = mv.version_excess(absr, free, pv, thresholds=VT(ratio=2.0, z=2.5))
    assert ve["version_1_over_reference"] == 2.0 and ve["z_by_version"]["1"] == np.inf
    assert ve["flagged"] == [1] and ve["flagged_by"]["1"] == ["median", "mean", "upper_quartile"]
    above = VT(ratio=2.0 + 2.0 ** -40, z=2.5, quartile_ratio=2.0 + 2.0 ** -40)
    assert mv.version_excess(absr, free, pv, thresholds=above)["flagged"] == []


def test_an_excess_without_spread_passes_any_z_bar():
    """z = +inf (every jackknife estimate the same) is at least any bar, +inf included."""
    absr, free, pv = _tokens([[(0, 0.5)] * 3] * 4 + [[(1, 1.0)] * 3] * 4)
    assert mv.version_excess(absr, free, pv, thresholds=VT(ratio=1.5, z=np.inf))["flagged"] == [1]


def test_the_trainer_noise_bar_at_a_quarter_of_the_first_versions_median():
    """Version 0's median |r| is 0.5: a run-to-run noise of exactly 0.125 (a quarter) makes the test
    untestable, one 2^-30 below does not."""
    absr, free, pv = _tokens([[(0, 0.5)] * 3] * 4 + [[(1, 1.0)] * 3] * 4)
    out = mv.version_excess(absr, free, pv, noise=0.125)
    assert out["flagged"] == [] and "0.125 nats" in out["untestable"] and "reference_version" not in out
    below = mv.version_excess(absr, free, pv, noise=0.125 - 2.0 ** -30)
    assert "untestable" not in below and below["reference_version"] == 0 and below["flagged"] == [1]


@pytest.mark.parametrize("shape", ["long", "wide"])
def test_the_sequences_are_counted_along_axis_0(shape):
    """The jackknife needs ``min_fit_sequences`` sequences holding the two versions' tokens, counted over
    sequences, not positions. ``long``: min - 1 sequences of 8 positions (version 0 in the first four,
    version 1 in the last four): too few, nothing flagged although version 1 is 2x version 0 on every
    token. ``wide``: min sequences of 2 positions (one token of each version): flagged."""
    n_min = defaults().min_fit_sequences
    assert n_min == 4
    if shape == "long":
        rows = [[(0, 0.5)] * 4 + [(1, 1.0)] * 4] * (n_min - 1)
    else:
        rows = [[(0, 0.5), (1, 1.0)]] * n_min
    absr, free, pv = _tokens(rows)
    ve = mv.version_excess(absr, free, pv, thresholds=VT(ratio=1.6, z=2.5))
    assert ve["version_1_over_reference"] == 2.0
    if shape == "long":
        assert np.isnan(ve["z_by_version"]["1"]) and ve["flagged"] == []
    else:
        assert ve["z_by_version"]["1"] == np.inf and ve["flagged"] == [1]


def test_a_jackknife_estimate_on_a_single_token_of_a_version_counts():
    """Each version in two sequences, three tokens and one: leaving out the sequence of three leaves one
    token of that version, a valid estimate (the same |r|), so the jackknife has no spread and version 1
    (4x version 0) is flagged."""
    absr, free, pv = _tokens([[(0, 0.25)] * 3, [(0, 0.25), None, None], [(1, 1.0)] * 3, [(1, 1.0), None, None]])
    ve = mv.version_excess(absr, free, pv, thresholds=VT(ratio=1.6, z=2.5))
    assert ve["n_tokens_by_version"] == {"0": 4, "1": 4}
    assert ve["version_1_over_reference"] == 4.0 and ve["z_by_version"]["1"] == np.inf and ve["flagged"] == [1]


def test_a_version_confined_to_one_sequence_is_untested_without_a_warning():
    """Version 1's four tokens all lie in one sequence: leaving it out leaves no token of version 1, that
    estimate is missing, so there is no error and no z (nothing flagged), and no numpy warning about an
    empty slice escapes."""
    absr, free, pv = _tokens([[(0, 0.25)]] * 4 + [[(1, 1.0)] * 4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ve = mv.version_excess(absr, free, pv, thresholds=VT(ratio=1.6, z=2.5))
    assert ve["version_1_over_reference"] == 4.0
    assert np.isnan(ve["z_by_version"]["1"]) and np.isnan(ve["mean_z_by_version"]["1"]) and ve["flagged"] == []
    # the same with the reference version in one sequence
    absr, free, pv = _tokens([[(0, 0.25)] * 4] + [[(1, 1.0)]] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ve = mv.version_excess(absr, free, pv, thresholds=VT(ratio=1.6, z=2.5))
    assert np.isnan(ve["z_by_version"]["1"]) and ve["flagged"] == []


def test_fingerprints_that_agree_and_floors_per_version():
    """A version whose fingerprints agree is reported but never flagged; with a floor for every version
    the ratio is :func:`floor_excess_ratio` of the medians (by hand: c = 0.5 - 0.25 = 0.25, version 1
    expected at 0.25 + 0.25 = 0.5, so 1.0 / 0.5 = 2, version 0 at 0.5 / 0.5 = 1)."""
    absr, free, pv = _tokens([[(0, 0.5)] * 3] * 4 + [[(1, 1.0)] * 3] * 4)
    ve = mv.version_excess(absr, free, pv, fingerprints_equal=[1], thresholds=VT(ratio=1.6, z=2.5))
    assert ve["fingerprints_equal"] == [1] and ve["flagged"] == [] and ve["z_by_version"]["1"] == np.inf
    ve = mv.version_excess(absr, free, pv, floors={0: 0.25, 1: 0.25}, thresholds=VT(ratio=1.6, z=2.5))
    assert ve["measured_against"] == "each version's own floor" and ve["version_1_over_reference"] == 2.0
    # a floor missing: plain ratio
    ve = mv.version_excess(absr, free, pv, floors={0: 0.25}, thresholds=VT(ratio=1.6, z=2.5))
    assert ve["measured_against"].startswith("the first version's level") and ve["version_1_over_reference"] == 2.0
    # a version with fewer than 4 free tokens is not tested; with one version left there is no test
    absr, free, pv = _tokens([[(0, 0.5)] * 3] * 4 + [[(1, 1.0)] * 3])
    assert mv.version_excess(absr, free, pv) == {}


def test_upper_quartile_by_hand():
    """numpy's linear interpolation at 0.75, written out: (n - 1) * 0.75 between the sorted values."""
    assert mv.upper_quartile(np.array([5.0, 1.0, 3.0, 2.0, 4.0])) == 4.0  # index 3 exactly
    assert mv.upper_quartile(np.array([0.0, 1.0])) == 0.75  # index 0.75: a quarter of the way from 0 to 1
    assert mv.upper_quartile(np.array([0.25] * 7 + [8.0])) == 0.25  # index 5.25 lies among the seven small ones


def test_a_version_seen_by_its_upper_quartile_alone_at_exactly_its_bar():
    """A partial sync that moves a minority of tokens far: version 0 holds seven tokens at 0.25 and one at 8
    per sequence (median and upper quartile 0.25, mean 9.75 / 8), version 1 four at 0.25 and four at 0.5
    (median 0.375, upper quartile 0.5, mean 0.375). By hand: median ratio 1.5 and mean ratio 0.375 / 1.21875
    stay below 1.6; the upper quartile's ratio is exactly 2, without spread (z = +inf). A quartile bar of 2
    flags version 1 by that statistic alone; one just above 2 does not, nor does the median's bar at 1.5 + 2^-40."""
    absr, free, pv = _tokens([[(0, 0.25)] * 7 + [(0, 8.0)]] * 5 + [[(1, 0.25)] * 4 + [(1, 0.5)] * 4] * 5)
    ve = mv.version_excess(absr, free, pv, thresholds=VT(ratio=1.6, z=2.5, quartile_ratio=2.0))
    assert ve["version_1_over_reference"] == 1.5
    assert ve["mean_over_reference_by_version"]["1"] == pytest.approx(0.375 / 1.21875, rel=1e-12)
    assert ve["upper_quartile_over_reference_by_version"]["1"] == 2.0
    assert ve["upper_quartile_z_by_version"]["1"] == np.inf
    assert ve["quartile_ratio_threshold"] == 2.0
    assert ve["flagged"] == [1] and ve["flagged_by"]["1"] == ["upper_quartile"]
    above = VT(ratio=1.6, z=2.5, quartile_ratio=2.0 + 2.0 ** -40)
    assert mv.version_excess(absr, free, pv, thresholds=above)["flagged"] == []
    # the median's own bar does not reach it, and the quartile's bar is not the median's
    above = VT(ratio=1.5 + 2.0 ** -40, z=2.5, quartile_ratio=3.0)
    assert mv.version_excess(absr, free, pv, thresholds=above)["flagged"] == []
    at_bar = VT(ratio=1.5, z=2.5, quartile_ratio=3.0)
    assert mv.version_excess(absr, free, pv, thresholds=at_bar)["flagged_by"]["1"] == ["median"]
    # the default bar (1.6) flags it; a z bar of +inf too (no spread); fingerprints that agree never
    assert mv.version_excess(absr, free, pv)["flagged_by"]["1"] == ["upper_quartile"]
    assert mv.version_excess(absr, free, pv, thresholds=VT(z=np.inf))["flagged"] == [1]
    assert mv.version_excess(absr, free, pv, fingerprints_equal=[1])["flagged"] == []


@pytest.mark.parametrize("floors", [None, {0: 0.25, 1: 0.25}, {0: 0.0, 1: 0.0}])
def test_two_versions_that_match_exactly_are_never_flagged(floors):
    """Both sides agree exactly on every token of both versions (|r| = 0: CPU float32, identical weights): every
    statistic is 0 on both sides, its ratio exactly 1 (0 over 0 read as equal, also over equal floors, the 0 ones
    of a batch-invariant trainer included), no z, no flag, in the plain, the floor and the logit readings."""
    absr, free, pv = _tokens([[(0, 0.0)] * 3] * 4 + [[(1, 0.0)] * 3] * 4)
    scaled = np.zeros_like(absr)
    ve = mv.version_excess(absr, free, pv, floors=floors, scaled=scaled,
                           thresholds=VT(ratio=1.5, z=2.5, logit_ratio=1.5, quartile_ratio=1.5))
    assert ve["version_1_over_reference"] == 1.0 and np.isnan(ve["z_by_version"]["1"])
    for key in ("mean", "logit_median", "upper_quartile"):
        assert ve[f"{key}_over_reference_by_version"]["1"] == 1.0
    assert ve["flagged"] == []
    # version 1 exactly matched, version 0 not: far below 1, never flagged; the reverse: far above, flagged
    absr, free, pv = _tokens([[(0, 0.5)] * 3] * 4 + [[(1, 0.0)] * 3] * 4)
    assert mv.version_excess(absr, free, pv, floors=floors, thresholds=VT(ratio=1.5, z=2.5))["flagged"] == []
    absr, free, pv = _tokens([[(0, 0.0)] * 3] * 4 + [[(1, 0.5)] * 3] * 4)
    assert mv.version_excess(absr, free, pv, floors=floors, thresholds=VT(ratio=1.5, z=2.5))["flagged"] == [1]


def test_logit_scale_floors_one_minus_p():
    """|r| / (1 - p), p the smaller side's probability, 1 - p at least 1e-6 (a token the trainer gives p = 1)."""
    mu, matched = np.log(np.array([0.5, 0.75, 1.0, 0.5])), np.log(np.array([0.75, 0.5, 1.0, 1.0]))
    got = mv.logit_scale(np.array([0.25, 0.25, 2e-6, 0.25]), mu, matched)
    np.testing.assert_allclose(got, [0.5, 0.5, 2.0, 0.5], rtol=1e-12)
    assert mv.logit_scale(np.array([2e-6]), np.array([0.0]), np.array([-1e-9]))[0] == pytest.approx(2.0, rel=1e-12)


def test_the_floor_share_is_read_from_the_means():
    """The H100 shape (issue 41): version 0's |r| is mostly small with one large token a sequence, so its
    median (0.125) lies below its floor (0.25, a mean) while its mean (0.375) lies above it; version 1's
    floor is 3x. The floor model takes c from the mean, 0.375 - 0.25 = 0.125, and predicts version 1 at
    (0.125 + 0.75) / (0.125 + 0.25) = 7/3 of version 0 in every statistic (c from the median would be 0 and
    predict 3x). Version 1 at 4x every token reads 4 / (7/3) = 12/7 in the median, the mean and the upper
    quartile (v0's: index 11.25 of 16 sorted values, 0.125 + 0.25 * 1.0 = 0.375), no spread: flagged at
    1.6; at 2x it reads 6/7 and is not."""
    v0 = [(0, 0.125)] * 3 + [(0, 1.125)]
    floors = {0: 0.25, 1: 0.75}
    for scale, flagged in ((4.0, [1]), (2.0, [])):
        absr, free, pv = _tokens([v0] * 4 + [[(1, scale * r) for _, r in v0]] * 4)
        ve = mv.version_excess(absr, free, pv, floors=floors, thresholds=VT(ratio=1.6, z=2.5, quartile_ratio=1.6))
        want = scale / ((0.125 + 0.75) / (0.125 + 0.25))
        assert ve["version_1_over_reference"] == pytest.approx(want, rel=1e-12)
        assert ve["mean_over_reference_by_version"]["1"] == pytest.approx(want, rel=1e-12)
        assert ve["upper_quartile_over_reference_by_version"]["1"] == pytest.approx(want, rel=1e-12)
        assert ve["flagged"] == flagged
    assert 4.0 / 3.0 < 1.6  # c from the median (0) would have predicted 3x: 4x reads 4/3, not flagged
