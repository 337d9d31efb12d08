"""``dim=`` on the tables: the one-line refusal of a function of a whole arm.

The reductions of :mod:`rlparity.metrics` take ``dim=`` (ArviZ style: a numpy core over axes, a
thin xarray layer, :func:`rlparity.metrics.summary.reduce`). A table whose every number is a
property of a whole arm (a batch probe, an update's lag counts, a peer's per-batch dashboard, a
step of a run) takes ``dim=`` only to refuse it, saying where the per-token view lives.
"""

from __future__ import annotations

from typing import Any


def refuse_dim(dim: Any, what: str, instead: str) -> None:
    """Raise a one-line ``ValueError`` unless ``dim`` is None.

    Parameters
    ----------
    dim : object
        The ``dim=`` a caller gave.
    what : str
        What the function computes (the subject of the message).
    instead : str
        Where the per-sequence / per-position view lives.

    Returns
    -------
    None
    """
    if dim is not None:
        raise ValueError(f"dim={dim!r}: {what} is a function of the whole arm; {instead}")


__all__ = ["refuse_dim"]
