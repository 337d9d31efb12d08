"""The fault library and the fault matrix.

Every named cause of a rollout/trainer mismatch is a recipe that changes one thing on a real vLLM
engine or on the trainer, composable into one capture (:mod:`~rlparity.experiments.faults.recipes`:
:data:`FAULTS`, keyed by the cause names of :data:`rlparity.diagnose.causes.CAUSES`;
:func:`~rlparity.experiments.faults.recipes.compose`); the fault matrix runs sets of them on real
engines and the real trainer, and proves the diagnosis names them
(:mod:`~rlparity.experiments.faults.matrix`: :func:`~rlparity.experiments.faults.matrix.run_matrix`).
Every public name is importable from here.

From a shell: ``rlparity experiment faults --size tiny --out runs/faults`` (the store
``runs/faults/faults.zarr``, the scores in ``runs/faults/faults.json``, ``--example NAME`` for a compact
example store) and ``rlparity faults score runs/faults/faults.zarr``.
"""

from __future__ import annotations

from rlparity.experiments.faults.matrix import MatrixSettings, partial_checkpoint, run_matrix, run_matrix_repeats
from rlparity.experiments.faults.recipes import (
    ARM_SEP,
    CLEAN,
    FAULTS,
    PAIR_CAUSES,
    Fault,
    Plan,
    compose,
    default_arms,
    parse_arms,
)

__all__ = ["ARM_SEP", "CLEAN", "FAULTS", "PAIR_CAUSES", "Fault", "MatrixSettings", "Plan", "compose", "default_arms",
           "parse_arms", "partial_checkpoint", "run_matrix", "run_matrix_repeats"]
