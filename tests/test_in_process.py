"""rlparity.capture.in_process: the switch that puts the offline engine's core in the calling process (the
engine-side check, a capture bit for bit equal to vLLM's core process, is in test_engine)."""

import pytest

from rlparity.capture.in_process import IN_PROCESS_ENV, async_core_env, in_process_core, in_process_requested


@pytest.mark.parametrize("raw, on", [(None, False), ("", False), ("off", False), ("0", False), ("No", False),
                                     ("on", True), ("1", True), (" TRUE ", True), ("yes", True)])
def test_the_switch_reads_on_and_off_and_defaults_to_vllms_own_process(raw, on, monkeypatch):
    if raw is None:
        monkeypatch.delenv(IN_PROCESS_ENV, raising=False)
    else:
        monkeypatch.setenv(IN_PROCESS_ENV, raw)
    assert in_process_requested() is on


def test_anything_else_is_an_error_and_off_changes_nothing(monkeypatch):
    import os

    monkeypatch.setenv(IN_PROCESS_ENV, "/tmp/x")
    with pytest.raises(ValueError, match="on or off"):
        in_process_requested()
    monkeypatch.setenv(IN_PROCESS_ENV, "off")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    with in_process_core() as restore:
        assert restore is None and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    with async_core_env():
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    monkeypatch.setenv(IN_PROCESS_ENV, "on")
    with in_process_core() as restore:  # vLLM's switch only while the engine is built
        assert callable(restore) and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    with async_core_env():  # AsyncLLM's core process inherits it while it is started
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ


def test_a_batch_invariant_engine_keeps_its_core_in_a_process_of_its_own(monkeypatch):
    """vLLM's batch-invariant mode overrides torch kernels in the worker's process for good: with it (the
    setting or vLLM's variable) the switch leaves the engine's core where vLLM puts it."""
    import os

    from rlparity.config.settings import EngineSettings

    monkeypatch.setenv(IN_PROCESS_ENV, "on")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    for settings, env, inside in ((EngineSettings(batch_invariant=True), None, False),
                                  (EngineSettings(), "1", False), (EngineSettings(batch_invariant=False), "1", True),
                                  (EngineSettings(), None, True), (None, None, True)):
        if env is None:
            monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
        else:
            monkeypatch.setenv("VLLM_BATCH_INVARIANT", env)
        with in_process_core(settings) as restore:
            assert (restore is not None) is inside, (settings, env)
            assert (os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0") is inside


def test_restore_puts_back_what_an_in_process_core_changes_in_its_caller(monkeypatch):
    """What vLLM's in-process core does to its caller (the thread count lowered and ``torch.set_num_threads``
    made a no-op, the global generators seeded, a handler and a level on the ``vllm`` logger), undone by the
    restore ``in_process_core`` yields: the same thread count and function, the next random draws those the
    caller would have made, the logger as it was."""
    import logging
    import random

    import numpy as np
    import torch

    monkeypatch.setenv(IN_PROCESS_ENV, "on")
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    log = logging.getLogger("vllm")
    handlers, level = list(log.handlers), log.level
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    expected = (random.random(), np.random.random(), torch.rand(1).item())  # the caller's next draws
    random.setstate(state[0]), np.random.set_state(state[1]), torch.set_rng_state(state[2])
    try:
        with in_process_core() as restore:
            torch.set_num_threads(max(1, threads // 2) if threads > 1 else 2)  # what vLLM's CPU worker does
            monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
            random.seed(0), np.random.seed(0), torch.manual_seed(0)  # the engine's seed
            extra = logging.StreamHandler()
            log.addHandler(extra)
            log.setLevel(logging.CRITICAL if level != logging.CRITICAL else logging.DEBUG)
        restore()
        assert torch.set_num_threads is set_threads and torch.get_num_threads() == threads
        assert (random.random(), np.random.random(), torch.rand(1).item()) == expected
        assert log.handlers == handlers and extra not in log.handlers and log.level == level
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
