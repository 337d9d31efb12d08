"""Experiments: capture the same prompts under several named settings, rescore each arm with the
trainer, and return every arm in one store (``{arm: trace}``, saved as one zarr DataTree).

Each module is one experiment of the method: :mod:`~rlparity.experiments.semantic` (logprob
meaning, temperature sweep), :mod:`~rlparity.experiments.ablation` (inference path, one knob at a
time), :mod:`~rlparity.experiments.head_precision` (LM-head precision matrix). Runners reuse one engine per
setting through :func:`rlparity.capture.pool.shared_pool`.
"""
