"""The run recorder inside verl's ``RayPPOTrainer`` (a hook on the method that writes
``trainer.rollout_data_dir``).

::

    trainer = RayPPOTrainer(config, ...)       # trainer.rollout_data_dir set,
    hook = record_verl(trainer, "runs/verl.zarr")  # actor_rollout_ref.rollout.calculate_log_probs=True
    trainer.fit()
    hook.close()

verl's own dump (``RayPPOTrainer._dump_generations``: ``{step}.jsonl`` of decoded ``input`` /
``output`` text, ``score``, ``gts``) holds no token ids and no logprobs, so no reader of those
files alone can compare anything. The batch verl hands to ``_log_rollout_data`` at every step
(``verl/trainer/ppo/ray_trainer.py``, commit b178a3c, pinned in ``scripts/peers/verl_rollout_data_dir.py``)
holds them all: :func:`record_verl` wraps that method of the trainer instance, lets verl write its
jsonl as before, and records one :meth:`~rlparity.record.Recorder.step` from the batch:

* ``prompts`` (left-padded; real tokens from ``attention_mask[:, :P]``), ``responses`` with
  ``response_mask``;
* ``rollout_log_probs`` (mu: the engine's, present with ``rollout.calculate_log_probs=True``) and
  ``old_log_probs`` (pi_old, ``processed``: ``dp_actor.compute_log_prob`` divides the logits by
  the rollout temperature; it applies no top-k / top-p);
* rewards: ``token_level_scores.sum(-1)`` (the ``score`` verl's jsonl holds); advantages: the
  per-token ``advantages`` where they are constant over a response (GRPO, RLOO: one per
  sequence), else left missing (GAE); groups from ``non_tensor_batch["uid"]``;
* versions: ``trainer.global_steps``. ``RayPPOTrainer.fit`` generates, recomputes pi_old and then
  updates, one step after the other (synchronous), so every token is generated and scored by the
  step's weights.

Left missing (and said so in the store's ``attrs["peer"]``): the engine's weight digest (verl's
sync reports none), finish reasons (not in the batch), and ``old_log_probs`` is a copy of
``rollout_log_probs`` in verl's bypass mode (the recorder then reads a gap of exactly 0).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlparity.record import Recorder, RecorderSettings, StepMetrics, StepRecord

SOURCE = "volcengine/verl verl/trainer/ppo/ray_trainer.py @ b178a3c (RayPPOTrainer._log_rollout_data)"
MISSING = {
    "weight_digest": "verl's weight sync reports no checksums of the engine's weights",
    "finish_reason": "verl's batch keeps no finish reason",
}
_NONE = object()


def _array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def verl_sampling(trainer: Any) -> dict[str, Any] | None:
    """The rollout's sampling parameters from a verl trainer's config
    (``actor_rollout_ref.rollout``: temperature, top_k with -1 = off, top_p); ``None`` without one.

    Parameters
    ----------
    trainer : Any
        A ``RayPPOTrainer`` (or anything with ``config.actor_rollout_ref.rollout``).

    Returns
    -------
    dict or None
        ``{"temperature", "top_k" (0 = off), "top_p"}``.
    """
    rollout = getattr(getattr(getattr(trainer, "config", None), "actor_rollout_ref", None), "rollout", None)
    if rollout is None:
        return None
    top_k = int(getattr(rollout, "top_k", -1) or 0)
    return {"temperature": float(rollout.temperature), "top_k": max(top_k, 0),
            "top_p": float(getattr(rollout, "top_p", 1.0))}


def per_sequence(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """One value per sequence of a per-token array that is constant over each response (verl's
    GRPO / RLOO advantages broadcast along the tokens); NaN for a sequence whose values vary (GAE)
    or that has no real token.

    Parameters
    ----------
    values : numpy.ndarray
        ``(sequence, position)``.
    mask : numpy.ndarray
        True on real response tokens.

    Returns
    -------
    numpy.ndarray
        ``(sequence,)`` float64.
    """
    v = np.asarray(values, np.float64)
    m = np.asarray(mask, bool)
    hi = np.where(m, v, -np.inf).max(axis=1, initial=-np.inf)
    lo = np.where(m, v, np.inf).min(axis=1, initial=np.inf)
    return np.where(m.any(axis=1) & (hi == lo), hi, np.nan)


def step_record(batch: Any, step: int, sampling: Mapping[str, Any]) -> StepRecord:
    """The :class:`~rlparity.record.StepRecord` of one verl batch (a ``DataProto``: ``.batch``
    tensors, ``.non_tensor_batch`` arrays) at ``step``.

    Parameters
    ----------
    batch : verl.DataProto
        What ``RayPPOTrainer.fit`` passes to ``_log_rollout_data``.
    step : int
        ``trainer.global_steps``.
    sampling : Mapping[str, Any]
        ``temperature``, ``top_k`` (0 = off), ``top_p`` of the rollout.

    Returns
    -------
    StepRecord

    Raises
    ------
    ValueError
        The batch lacks the engine's logprobs or pi_old (the message says which verl option adds them).
    """
    t = batch.batch
    keys = set(t.keys())
    if "rollout_log_probs" not in keys:
        raise ValueError("verl's batch has no rollout_log_probs (the engine's logprobs): run with "
                         "actor_rollout_ref.rollout.calculate_log_probs=True")
    if "old_log_probs" not in keys:
        raise ValueError("verl's batch has no old_log_probs (pi_old): record after compute_log_prob, as "
                         "_log_rollout_data is called")
    prompts = _array(t["prompts"])
    width = prompts.shape[1]
    responses = _array(t["responses"])
    attention = _array(t["attention_mask"]).astype(bool) if "attention_mask" in keys else None
    if "response_mask" in keys:
        rmask = _array(t["response_mask"]).astype(bool)
    elif attention is not None:
        rmask = attention[:, width:]
    else:
        raise ValueError("verl's batch has neither response_mask nor attention_mask: the real response tokens "
                         "are unknown")
    pmask = attention[:, :width] if attention is not None else np.ones(prompts.shape, bool)
    n = responses.shape[0]
    rewards = _array(t["token_level_scores"]).astype(np.float64).sum(-1) if "token_level_scores" in keys else None
    advantages = per_sequence(_array(t["advantages"]), rmask) if "advantages" in keys else None
    nt = getattr(batch, "non_tensor_batch", None) or {}
    groups = None
    if "uid" in nt:
        _, groups = np.unique(np.asarray(nt["uid"]).astype(str), return_inverse=True)
    return StepRecord(
        prompt_token_ids=prompts, prompt_mask=pmask, token_ids=responses, response_mask=rmask,
        rollout_logprobs=_array(t["rollout_log_probs"]), trainer_logprobs=_array(t["old_log_probs"]),
        rewards=rewards, advantages=advantages, prompt_index=groups,
        temperature=float(sampling["temperature"]), top_k=int(sampling.get("top_k", 0)),
        top_p=float(sampling.get("top_p", 1.0)), finish_reasons=["unknown"] * n,
        trainer_version=int(step), step=int(step))


class VerlRecording:
    """What :func:`record_verl` attached to a trainer: the recorder, the last step's metrics and the
    time spent recording.

    Parameters
    ----------
    trainer : Any
        A ``RayPPOTrainer`` (anything with verl's ``_log_rollout_data`` and ``global_steps``).
    recorder : Recorder
        Where the steps go.
    sampling : Mapping[str, Any]
        The rollout's temperature, top_k (0 = off), top_p.
    """

    def __init__(self, trainer: Any, recorder: Recorder, sampling: Mapping[str, Any]):
        self.trainer = trainer
        self.recorder = recorder
        self.sampling = dict(sampling)
        self.last: StepMetrics | None = None
        self.seconds = 0.0
        self._original = trainer._log_rollout_data
        self._before = trainer.__dict__.get("_log_rollout_data", _NONE)
        trainer._log_rollout_data = self._log_rollout_data

    def _log_rollout_data(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        out = self._original(batch, *args, **kwargs)  # verl writes its {step}.jsonl as before
        t0 = time.perf_counter()
        try:
            self.last = self.recorder.step(step_record(batch, int(self.trainer.global_steps), self.sampling))
        finally:
            self.seconds += time.perf_counter() - t0
        return out

    def close(self) -> None:
        """Commit the steps still queued, release the store and give the trainer its method back."""
        if self._before is _NONE:
            self.trainer.__dict__.pop("_log_rollout_data", None)
        else:
            self.trainer._log_rollout_data = self._before
        self.recorder.close()


def record_verl(trainer: Any, path: str | os.PathLike, settings: RecorderSettings | None = None, *,
                sampling: Mapping[str, Any] | None = None, resume: bool = False, overwrite: bool = False,
                **overrides: Any) -> VerlRecording:
    """Record every step of a verl ``RayPPOTrainer`` into a run store at ``path``, from the batch
    verl passes to ``_log_rollout_data`` (called at each step when ``trainer.rollout_data_dir`` is set).

    Parameters
    ----------
    trainer : Any
        The trainer, before ``fit()``.
    path : str or os.PathLike
        The run store (:class:`~rlparity.record.Recorder`).
    settings : RecorderSettings, optional
        Recorder settings (``trainer_side`` is ``processed``: verl's pi_old).
    sampling : Mapping[str, Any], optional
        ``temperature``, ``top_k`` (0 = off), ``top_p``; ``None``: the trainer's
        ``config.actor_rollout_ref.rollout``.
    resume, overwrite : bool, default False
        As :class:`~rlparity.record.Recorder`.
    **overrides : Any
        Fields of :class:`~rlparity.record.RecorderSettings`.

    Returns
    -------
    VerlRecording
        The attached hook; ``close()`` after training.

    Raises
    ------
    ValueError
        No sampling parameters (no config and none given), or the trainer has no ``_log_rollout_data``.
    """
    if not callable(getattr(trainer, "_log_rollout_data", None)):
        raise ValueError(f"{type(trainer).__name__} has no _log_rollout_data: record_verl hooks verl's "
                         "RayPPOTrainer (verl/trainer/ppo/ray_trainer.py)")
    sampling = dict(sampling) if sampling is not None else verl_sampling(trainer)
    if sampling is None or "temperature" not in sampling:
        raise ValueError("the rollout's sampling is unknown: pass sampling={'temperature': ..., 'top_k': ..., "
                         "'top_p': ...} or a trainer with config.actor_rollout_ref.rollout")
    base = settings or RecorderSettings()
    attrs = {**dict(base.attrs or {}), "peer": {"framework": "verl", "source": SOURCE, "missing": dict(MISSING),
                                                "versions": "global_steps: RayPPOTrainer.fit is synchronous"}}
    rec = Recorder(path, base, resume=resume, overwrite=overwrite,
                   **{"trainer_side": "processed", "sampling": sampling, "attrs": attrs, **overrides})
    return VerlRecording(trainer, rec, sampling)


__all__ = ["MISSING", "SOURCE", "VerlRecording", "per_sequence", "record_verl", "step_record", "verl_sampling"]
