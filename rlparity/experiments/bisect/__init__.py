"""Bisect on the user's own tokens: replay them under the capture's settings, then one knob at a time.

From the capture's own engine settings (recorded in the trace, or given), the trace's tokens are
replayed twice under those settings (the baseline and the **replay floor**: what the engine
changes on its own), then once per knob with that single setting flipped. Every replayed arm holds
the same tokens and the source's trainer numbers, so each knob's shift is measured on exactly the
user's tokens (:func:`rlparity.metrics.replay.knob_table`), in units of the floor, with the tokens it
moves most.

Knobs (:data:`KNOBS`) reuse the inference-path ablation's (:mod:`rlparity.experiments.ablation`):
prefix caching on/off and a warm against a cold cache, async scheduling, eager against compiled,
one sequence at a time (``max_num_seqs=1``), chunked prefill, the LM head's precision (float32
against bfloat16), another attention backend and batch-invariant kernels. A knob the platform does
not honour (vLLM resolves it away, the engine refuses it, or the running engine reports the
reference value) is recorded as not applicable with the reason; one past the ``budget`` of engine
starts is recorded as skipped.

**Pairs** (:func:`pair_plan`): a single knob *explains* the gap when flipping it closes at least
``defaults().bisect_explained_share`` of the baseline replay's gap against the trainer
(:func:`rlparity.metrics.replay.explained_share`). Where none does, the knobs that moved at least
one token beyond the replay floor's largest ``|delta|`` are flipped two at a time, the pairs whose
two knobs close most of the gap first (then the larger summed shift), within what is left of the
budget; pairs of knobs that set the same engine field, and pairs past the budget, are listed as
skipped with why. Without trainer numbers the rule cannot be judged: pairs run only when forced.

**Layers** (:func:`localise`, ``bisect(..., layers=True)``): the winning arm's worst tokens go to
the per-layer localisation: the sequences that hold them run through an eager engine under the
baseline settings (twice: its run-to-run floor) and under the winning settings, and the first site
(:mod:`rlparity.trace.layers`) whose relative error leaves its floor is where they part.

One concern a module: :mod:`~rlparity.experiments.bisect.knobs` (the knobs and the arms' names),
:mod:`~rlparity.experiments.bisect.pairs` (the pair plan and the winner, by explained share),
:mod:`~rlparity.experiments.bisect.run` (:class:`BisectOptions`, the run as a :class:`Bisection`,
:func:`bisect`), :mod:`~rlparity.experiments.bisect.layers` (the hand-off to :func:`localise`) and
:mod:`~rlparity.experiments.bisect.report` (:func:`report`: what ``rlparity bisect --json`` prints);
every public name is importable from here.
"""

from __future__ import annotations

from rlparity.experiments.bisect.knobs import BASELINE, DEFAULT_KNOBS, FLOOR, KNOBS, LAYER_STARTS, PAIRS, BisectKnob
from rlparity.experiments.bisect.layers import localise
from rlparity.experiments.bisect.pairs import pair_name, pair_plan, winner
from rlparity.experiments.bisect.report import capture_state, report
from rlparity.experiments.bisect.run import BisectOptions, Bisection, bisect

__all__ = ["BASELINE", "DEFAULT_KNOBS", "FLOOR", "KNOBS", "LAYER_STARTS", "PAIRS", "BisectKnob", "BisectOptions",
           "Bisection", "bisect", "capture_state", "localise", "pair_name", "pair_plan", "report", "winner"]
