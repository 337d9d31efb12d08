"""Scoped environment variables: set for a block, restored after it (one implementation)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def scoped_env(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` in ``os.environ`` for the block; restore the previous values (or absence) after.

    Parameters
    ----------
    env : Mapping[str, str]
        Variables and their values (converted to text).

    Yields
    ------
    None
        Control returns to the block with the variables set.
    """
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["scoped_env"]
