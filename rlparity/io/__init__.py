"""Deprecated name of :mod:`rlparity.importers` (the importers of other frameworks' rollout dumps),
kept for one release: importing it warns (``DeprecationWarning``) and gives the same module, so
``rlparity.io.read`` *is* ``rlparity.importers.read`` and ``import rlparity.io.generic`` gives
:mod:`rlparity.importers.generic`. Renamed because ``rlparity.io`` stood beside
:mod:`rlparity.trace.zarr_io` (saving traces) and read as the package's file I/O.
"""

import importlib
import sys
import warnings

warnings.warn("rlparity.io is renamed rlparity.importers; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)

_SUBMODULES = ("common", "formats", "generic", "jsonl", "nemorl", "pipelinerl", "primerl", "slime")
for _name in _SUBMODULES:
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"rlparity.importers.{_name}")
sys.modules[f"{__name__}.store"] = importlib.import_module("rlparity.importers.store_writer")
sys.modules[__name__] = importlib.import_module("rlparity.importers")
