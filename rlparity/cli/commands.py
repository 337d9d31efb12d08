"""Every command of the ``rlparity`` app, registered by importing its module."""

from rlparity.cli import traces, judge, path, data, rl, faults, floors, layers  # noqa: F401,I001  (help lists them in this order)

__all__: list[str] = []
