"""rlparity: why a rollout engine's token log-probabilities disagree with the trainer's.

Flow: :mod:`rlparity.capture` (real vLLM) -> :mod:`rlparity.score` (transformers trainer) ->
:mod:`rlparity.trace` (labelled xarray data, zarr) -> :mod:`rlparity.metrics` ->
:mod:`rlparity.diagnose` -> :mod:`rlparity.plot`.

Heavy libraries (vllm, torch, transformers) are imported only by the functions that need them.
"""

from importlib import metadata as _metadata

from rlparity.capture.settings import EngineSettings, SamplingSettings

try:
    __version__ = _metadata.version("rlparity")
except _metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0.0.0"


def capture(*args, **kwargs):
    """Capture rollouts with a fresh vLLM engine; see :func:`rlparity.capture.capture`."""
    from rlparity.capture import capture as _capture

    return _capture(*args, **kwargs)


def score(*args, **kwargs):
    """Rescore a trace with the trainer; see :func:`rlparity.score.score`."""
    from rlparity.score import score as _score

    return _score(*args, **kwargs)


def summary(*args, **kwargs):
    """Parity summary of a scored trace; see :func:`rlparity.metrics.summary`."""
    from rlparity.metrics import summary as _summary

    return _summary(*args, **kwargs)


def diagnose(*args, **kwargs):
    """Findings with verdicts for a trace or a store; see :func:`rlparity.diagnose.diagnose`."""
    from rlparity.diagnose import diagnose as _diagnose

    return _diagnose(*args, **kwargs)


__all__ = ["EngineSettings", "SamplingSettings", "__version__", "capture", "diagnose", "score", "summary"]
