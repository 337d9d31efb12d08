"""The importers' errors: a dump that cannot be read as its format, and a ``.pt`` file that needs
full pickle."""

from __future__ import annotations


class ImportFormatError(ValueError):
    """A dump cannot be read as the named format.

    The message names the file, the line (or sample) and the field, and says how to fix it.
    """


class PickleRefusedError(ImportFormatError):
    """A ``.pt`` file needs full pickle (arbitrary code) to load: rlparity refuses it."""
