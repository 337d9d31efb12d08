"""rlparity: why a rollout engine's token log-probabilities disagree with the trainer's.

Flow: :mod:`rlparity.capture` (real vLLM) -> :mod:`rlparity.score` (transformers trainer) ->
:mod:`rlparity.trace` (labelled xarray data, zarr) -> :mod:`rlparity.metrics` ->
:mod:`rlparity.diagnose` -> :mod:`rlparity.plot`.

Heavy libraries (vllm, torch, transformers) are imported only by the functions that need them.
"""

from importlib import metadata as _metadata

from rlparity.config.settings import EngineSettings, SamplingSettings

try:
    __version__ = _metadata.version("rlparity")
except _metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0.0.0"


def summary(*args, **kwargs):
    """Parity summary of a scored trace; see :func:`rlparity.metrics.summary`.

    Parameters
    ----------
    *args : Any
        Positional arguments of :func:`rlparity.metrics.summary`.
    **kwargs : Any
        Keyword arguments of :func:`rlparity.metrics.summary`.

    Returns
    -------
    xarray.Dataset
        The summary.
    """
    from rlparity.metrics import summary as _summary

    return _summary(*args, **kwargs)


# every part of the package a user reaches as rlparity.<name> (not the CLI, nor the test helpers)
_SUBPACKAGES = ("config", "capture", "score", "trace", "metrics", "diagnose", "plot", "record", "experiments", "importers", "train",
                "datasets", "models")


def __getattr__(name):
    """Import the flow's subpackages on first use: ``rlparity.diagnose.diagnose(...)``.

    The subpackages are modules, never shadowed by functions of the same name, so
    ``rlparity.capture.EngineSettings`` works whatever was imported before.
    """
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"rlparity.{name}")
    raise AttributeError(f"module 'rlparity' has no attribute {name!r}")


__all__ = ["EngineSettings", "SamplingSettings", "__version__", "summary", *_SUBPACKAGES]
