"""rlparity.capture.gc_pause: the collector paused for a block and put back as it was found (issue 39; the
engine-side check, a capture with the pause equal bit for bit to one without, is in test_engine)."""

import gc
import threading

import pytest

from rlparity.capture.gc_pause import gc_paused


class Collections:
    """Collections started (``gc.callbacks``), per generation, while installed."""

    def __init__(self):
        self.started = [0, 0, 0]

    def __call__(self, phase, info):
        if phase == "start":
            self.started[info["generation"]] += 1

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


@pytest.fixture(autouse=True)
def collector_on():
    """Each test starts with the collector enabled at CPython's thresholds, and leaves it so."""
    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if was else gc.disable)()


def allocate(n=20_000):
    """``n`` tracked containers kept alive (each adds one to the young generation's count)."""
    return [[i] for i in range(n)]


def test_no_collection_inside_and_the_young_one_it_owes_runs_at_the_first_allocation_after():
    gc.collect()
    with Collections() as free:  # the reference: the same allocations with the collector on
        kept = allocate()
    assert sum(free.started) >= 20_000 // 700 - 1  # one young collection per 700 new containers at least
    del kept
    gc.collect()
    with Collections() as paused:
        with gc_paused():
            assert not gc.isenabled()
            kept = allocate()
            assert gc.get_count()[0] >= 20_000  # the debt: every container still counted as young
            inside = tuple(paused.started)
        assert gc.isenabled()
        [].append([])  # the first tracked allocation after the block (at the latest) starts the collection it owed
        after = tuple(paused.started)
    assert inside == (0, 0, 0)
    assert after[0] + after[1] == 1 and after[2] == 0  # one young collection, no full one
    assert gc.get_count()[0] < 700
    del kept


def test_the_state_found_comes_back_on_exit_and_on_an_exception():
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError):
        with gc_paused():
            raise KeyError("inside")
    assert gc.isenabled()
    gc.disable()  # disabled stays disabled, exception or not
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
    with pytest.raises(KeyError):
        with gc_paused():
            raise KeyError("inside")
    assert not gc.isenabled()


def test_nested_blocks_and_blocks_that_close_out_of_order_restore_once_the_last_closes():
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still runs
    assert gc.isenabled()
    first, second = gc_paused(), gc_paused()  # two captures overlapping: the first to open closes first
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_threads_share_the_pause_until_the_last_block_closes():
    opened, release, states = threading.Event(), threading.Event(), []

    def other():
        with gc_paused():
            opened.set()
            release.wait(10)
        states.append(gc.isenabled())

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        assert opened.wait(10)
    assert not gc.isenabled()  # this thread's block closed first: the other one still runs
    release.set()
    t.join(10)
    assert states == [True] and gc.isenabled()


def test_pause_false_leaves_the_collector_as_it_is():
    gc.collect()
    with Collections() as seen:
        with gc_paused(False):
            assert gc.isenabled()
            kept = allocate()
    assert sum(seen.started) >= 20_000 // 700 - 1
    gc.disable()
    with gc_paused(False):
        assert not gc.isenabled()
    assert not gc.isenabled()
    del kept


def test_the_setting_is_a_default_on_and_can_be_turned_off():
    from rlparity.config import defaults, defaults_context

    assert defaults().capture_gc_pause is True
    with defaults_context(capture_gc_pause=False):
        assert defaults().capture_gc_pause is False
    assert defaults().capture_gc_pause is True
