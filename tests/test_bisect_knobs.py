"""The values a bisect knob sets against the capture's own settings (no engine)."""

from __future__ import annotations

import pytest

from rlparity.config.settings import EngineSettings
from rlparity.experiments.bisect.knobs import KNOBS, _settings_for


@pytest.mark.parametrize(("captured", "replayed"), [
    ("TRITON_ATTN", "FLASH_ATTN"),      # a capture on another kernel is replayed on the default
    ("FLEX_ATTENTION", "FLASH_ATTN"),
    ("FLASH_ATTN", "FLEX_ATTENTION"),   # a capture on the default is replayed on another kernel
    ("flash_attn", "FLEX_ATTENTION"),   # the engine's report in lower case reads the same
    (None, "FLEX_ATTENTION"),           # not reported: the engine's default, FlashAttention on a GPU
])
def test_the_attention_knob_replays_the_other_kernel(captured, replayed):
    ref = EngineSettings(attention_backend=captured)
    settings, value = _settings_for(KNOBS["attention_backend"], ref, {"attention_backend": captured})
    assert value == replayed and settings.attention_backend == replayed
    assert settings.replace(attention_backend=captured) == ref  # nothing else changed


def test_the_attention_knob_reads_the_running_engine_before_the_request():
    # asked for nothing, the engine reports TRITON_ATTN: the knob flips what ran
    _, value = _settings_for(KNOBS["attention_backend"], EngineSettings(), {"attention_backend": "TRITON_ATTN"})
    assert value == "FLASH_ATTN"


@pytest.mark.parametrize(("head", "replayed"), [("float32", "bfloat16"), ("bfloat16", "float32"), (None, "bfloat16")])
def test_the_head_knob_flips_the_head_precision(head, replayed):
    _, value = _settings_for(KNOBS["head_precision"], EngineSettings(head_dtype=head), {})
    assert value == replayed
