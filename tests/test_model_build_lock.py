"""Two processes asking for the same checkpoint build it once (rlparity.models.make_model's build lock):
the second waits for the first and then reuses what it wrote."""

from __future__ import annotations

import threading

from rlparity.models import make_model
from rlparity.models.checkpoint import build_lock


def test_a_second_request_waits_for_the_build_lock_then_reuses_the_checkpoint(tiny_model):
    from pathlib import Path

    out = Path(tiny_model)
    done = threading.Event()
    got = {}

    def ask():
        got["path"] = make_model("tiny", out=out, progress=False)
        done.set()

    with build_lock(out):
        t = threading.Thread(target=ask)
        t.start()
        assert not done.wait(1.0)  # held: the request waits (flock between descriptors of one process too)
    assert done.wait(60)
    t.join()
    assert got["path"] == out and (out / "config.json").exists()
