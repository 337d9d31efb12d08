"""One colour per profile or arm name across figures (rlparity.plot.palette)."""

from __future__ import annotations

import uuid

import numpy as np
import xarray as xr

from rlparity.plot.palette import KNOWN, QUALITATIVE, base_name, color, colors
from rlparity.testing import synthetic_trace


def _trace_colors(fig) -> dict[str, str]:
    out = {}
    for t in fig.data:
        c = (t.marker.color if t.type in ("histogram", "bar") else t.line.color)
        out[t.legendgroup or t.name] = c
    return out


def _routing_table(seed: int) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    return xr.Dataset({"flip_rate": ("moe_layer", rng.random(3)), "n_flips": ("moe_layer", [1, 2, 3]),
                       "n_tokens": ("moe_layer", [100, 100, 100])}, coords={"moe_layer": [0, 1, 2]})


def test_the_same_name_has_the_same_colour_in_two_different_figures(monkeypatch):
    import rlparity.plot.palette as palette
    from rlparity.plot.routing import plot_flip_rate_by_layer
    from rlparity.plot.semantic import plot_ratio_by_position, plot_ratio_histogram

    # a session of its own: in a long test run every colour can already be held, and a new name then
    # shares one by design (color's docstring), which made the last assertion depend on test order
    monkeypatch.setattr(palette, "_ASSIGNED", {})
    new = f"arm-{uuid.uuid4().hex[:6]}"  # a name no figure has seen
    arms = {"raw": synthetic_trace(logprobs_mode="raw_logprobs", arm="raw"), new: synthetic_trace(arm=new)}
    hist = plot_ratio_histogram(arms)
    # another figure, another module, the arms in the other order
    bars = plot_flip_rate_by_layer({new: _routing_table(1), "raw": _routing_table(2)})
    lines = _trace_colors(plot_ratio_by_position(dict(reversed(list(arms.items())))))
    h = {t.name.split(" (")[0]: t.marker.color for t in hist.data}
    b = {t.name: t.marker.color for t in bars.data}
    assert h["raw"] == b["raw"] == lines["raw"] == KNOWN["raw"]
    assert h[new] == b[new] == lines[new] == color(new)
    assert h[new] != h["raw"]


def test_known_names_are_fixed_and_labels_take_their_profile_colour():
    assert color("pipelinerl-parity") == color("pipelinerl-parity+mu") == color("pipelinerl-parity+pi_old")
    assert color("vllm-v1-defaults+mu") != color("pipelinerl-parity+mu") != color("parity-bf16-head+mu")
    assert base_name("parity (after one step)") == "parity" and color("parity (after one step)") == color("parity")
    assert base_name("keep-clear-prefix_on") == "keep-clear-prefix_on"


def test_the_arms_of_one_figure_get_distinct_colours_until_the_palette_runs_out(monkeypatch):
    from rlparity.plot import palette

    monkeypatch.setattr(palette, "_ASSIGNED", {})  # a fresh session: no name holds a colour yet
    tag = uuid.uuid4().hex[:6]
    names = [f"{tag}-{m}-{c}" for m in ("keep", "wait", "abort") for c in ("clear", "noclear")] + [f"{tag}-x{k}"
                                                                                                  for k in range(6)]
    got = colors(names)
    assert len(set(got.values())) == len(names) == 12
    assert set(got.values()) <= set(QUALITATIVE) and not set(got.values()) & set(KNOWN.values())
    assert colors(names) == got  # asked again (another figure): the same colours
    more = colors(f"{tag}-y{k}" for k in range(10))  # 22 names for 17 free colours: some share, none fails
    assert set(more.values()) <= set(QUALITATIVE)
