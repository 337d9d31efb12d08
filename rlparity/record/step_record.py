"""One step as a training loop holds it (:class:`StepRecord`), and its arrays checked and padded into
the run store's rows (:func:`step_rows`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.settings import with_overrides
from rlparity.metrics.objective import policy_variable
from rlparity.record.live import StepArrays
from rlparity.record.store import FINISH_REASONS
from rlparity.trace.record import arm_record
from rlparity.trace.schema import POSITIVE_TOLERANCE, pad_rows


@dataclass
class StepRecord:
    """One step, as the loop holds it. Token arrays are ragged (one list per sequence) or padded 2-d
    arrays with ``response_mask``; numpy arrays, lists or torch tensors.

    Parameters
    ----------
    prompt_token_ids : sequence of sequence of int or array
        The prompts' ids (padded: with ``prompt_mask``; left or right padding).
    token_ids : sequence of sequence of int or array
        The sampled response ids.
    rollout_logprobs : sequence of sequence of float or array
        The engine's logprob of each sampled token (mu, nats).
    trainer_logprobs : sequence of sequence of float or array
        The trainer's pi_old of each token (nats; which reading: ``RecorderSettings.trainer_side``).
    trainer_updated_logprobs : sequence of sequence of float or array, optional
        pi_theta, where the loop has it.
    response_mask : array, optional
        With padded token arrays: True on real tokens.
    prompt_mask : array, optional
        With padded prompts: True on real prompt tokens.
    policy_versions : int or per-token array, optional
        The policy version that generated each token; ``None``: ``trainer_version`` (on-policy).
    trainer_version : int, optional
        The trainer's policy version at this step; ``None``: the step's index.
    scored_version : int or per-token array, optional
        The version whose weights gave pi_old; ``None``: ``trainer_version`` (score each token at its
        own version: pass ``policy_versions``).
    rewards : sequence of float, optional
        One per sequence.
    advantages : sequence of float, optional
        One per sequence.
    temperature : float or sequence of float, optional
        The sampling temperature (one, or one per sequence); ``None``: the recorder's sampling.
    top_k : int or sequence of int, optional
        Top-k (0 = off); ``None``: the recorder's sampling.
    top_p : float or sequence of float, optional
        Top-p (1 = off); ``None``: the recorder's sampling.
    finish_reasons : sequence of str, optional
        Why each generation stopped (``stop``, ``length``, ``abort``).
    prompt_index : sequence of int, optional
        The prompt (group) of each sequence; ``None``: 0, 1, ...
    weight_version : int, optional
        The version the engine held at its last sync (the one the weight digest belongs to);
        ``None``: ``trainer_version``. A digest is compared with the previous sync's when this
        version is newer (the trainer stepped in between).
    weight_digest : Mapping[str, int or str], optional
        The engine's per-tensor checksums at that sync (:func:`weight_digest`; hex strings as
        ``rlparity verify-weights`` prints them are read too).
    digest_stride : int, optional
        The digest checksummed every ``digest_stride``-th value of each tensor; ``None``: the
        digest's own ``.stride`` (:func:`weight_digest`'s), else 1 (every value). Recorded per step;
        digests of two strides are never compared.
    step : int, optional
        The loop's own step number (recorded beside the store's index).
    """

    prompt_token_ids: Any
    token_ids: Any
    rollout_logprobs: Any
    trainer_logprobs: Any
    trainer_updated_logprobs: Any = None
    response_mask: Any = None
    prompt_mask: Any = None
    policy_versions: Any = None
    trainer_version: int | None = None
    scored_version: Any = None
    rewards: Any = None
    advantages: Any = None
    temperature: Any = None
    top_k: Any = None
    top_p: Any = None
    finish_reasons: Sequence[str] | None = None
    prompt_index: Sequence[int] | None = None
    weight_version: int | None = None
    weight_digest: Mapping[str, Any] | None = None
    digest_stride: int | None = None
    step: int | None = None

    @classmethod
    def from_trace(cls, trace: Any, trainer: TrainerSide | None = None, **fields: Any) -> StepRecord:
        """The step a scored rlparity trace holds (what :func:`rlparity.experiments.rl.rl_run` has
        after each optimizer step): its tokens, mu, pi_old (and pi_theta), versions, sampling,
        rewards and advantages; the engine's weight digest of the version that generated its
        tokens, from ``attrs["engine_weight_checksums"]``.

        Parameters
        ----------
        trace : xarray.Dataset
            A scored trace (one step's batch).
        trainer : {"processed", "raw"}, optional
            Which trainer reading is pi_old (the recorder's ``trainer_side``); ``None``:
            ``defaults().trainer``.
        **fields : Any
            Fields of :class:`StepRecord` that replace what the trace gives (e.g. ``step``).

        Returns
        -------
        StepRecord
            The step; ``scored_version`` is the trace's ``policy_version`` when the trainer scored
            each token at its own version (``attrs["trainer"]["scored_by"] == "policy_version"``).
        """
        from rlparity.trace.weights import engine_effective

        side = trainer or defaults().trainer
        mask = trace["response_mask"].values.astype(bool)
        pv = trace["policy_version"].values
        rec = arm_record(trace)
        own = rec.scorer.scored_by == "policy_version"
        latest = rec.latest_policy_version
        generated = int(pv[mask].max()) if mask.any() else None
        digests = engine_effective(trace.attrs)
        theta = policy_variable("theta", side)
        values = {
            "prompt_token_ids": trace["prompt_token_id"].values, "prompt_mask": trace["prompt_token_id"].values >= 0,
            "token_ids": trace["token_id"].values, "response_mask": mask,
            "rollout_logprobs": trace["rollout_logprob"].values,
            "trainer_logprobs": trace[policy_variable("old", side)].values,
            "trainer_updated_logprobs": trace[theta].values if theta in trace else None,
            "policy_versions": pv, "trainer_version": None if latest is None else int(latest),
            "scored_version": pv if own else None,
            "rewards": trace["reward"].values if "reward" in trace else None,
            "advantages": trace["advantage"].values if "advantage" in trace else None,
            "temperature": trace["temperature"].values, "top_k": trace["top_k"].values,
            "top_p": trace["top_p"].values, "finish_reasons": [str(x) for x in trace["finish_reason"].values],
            "prompt_index": trace["prompt_index"].values,
            "weight_version": generated if generated in digests else None,
            "weight_digest": digests.get(generated) if generated is not None else None,
        }
        return with_overrides(cls(**values), fields, "StepRecord.from_trace")


def _numpy(x: Any) -> Any:
    """A torch tensor as numpy (bf16 as float32); anything else as it is."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()
        return x.numpy()
    return x


def _rows(x: Any, mask: np.ndarray | None, what: str) -> list[np.ndarray]:
    """Ragged rows, a padded 2-d array with its ``mask``, or a 2-d array of real tokens only, as rows."""
    x = _numpy(x)
    if mask is not None:
        arr = np.asarray(x)
        if arr.shape != mask.shape:
            raise ValueError(f"{what} has shape {arr.shape} but its mask {mask.shape}: pass arrays of one shape")
        return [arr[i][mask[i]] for i in range(arr.shape[0])]
    if isinstance(x, np.ndarray) and x.ndim == 2:
        return list(x)
    return [np.asarray(_numpy(r)).reshape(-1) for r in x]


def _per_seq(x: Any, n: int, dtype: Any, default: Any, what: str) -> np.ndarray:
    x = default if x is None else _numpy(x)
    arr = np.asarray(x, dtype=dtype)
    if arr.ndim == 0:
        return np.full(n, arr, dtype=dtype)
    if arr.shape != (n,):
        raise ValueError(f"{what} has shape {arr.shape}: give one value, or one per sequence ({n})")
    return arr


def _per_token(value: Any, what: str, fill: Any, dtype: Any, *, mask: np.ndarray, mask_in: np.ndarray | None,
               lengths: np.ndarray) -> np.ndarray:
    """A per-token value (one for all tokens, ragged rows or a padded array) as a padded array."""
    n, width = len(lengths), mask.shape[1]
    value = _numpy(value)
    if isinstance(value, (int, float, np.integer, np.floating)) or (isinstance(value, np.ndarray)
                                                                     and value.ndim == 0):  # one value for all
        return np.where(mask, value, fill).astype(dtype)
    rows = _rows(value, mask_in, what)
    if len(rows) != n:
        raise ValueError(f"{what} has {len(rows)} sequences, token_ids {n}: pass one row per sequence")
    bad = [i for i, (row, length) in enumerate(zip(rows, lengths)) if len(row) != length]
    if bad:
        raise ValueError(f"sequence {bad[0]}: {len(rows[bad[0]])} {what} for {lengths[bad[0]]} tokens: pass "
                         "one per sampled token")
    return pad_rows(rows, fill, dtype, width)


def _refuse_positive(f64: dict[str, np.ndarray], mask: np.ndarray) -> None:
    """Raise on a positive log-probability on a real token (the trace schema's rule)."""
    for name, v in f64.items():
        with np.errstate(invalid="ignore"):
            pos = mask & (v > POSITIVE_TOLERANCE) & np.isfinite(v)
        if pos.any():
            i, j = (int(x[0]) for x in np.nonzero(pos))
            raise ValueError(f"{name} is positive at {int(pos.sum())} tokens (first: sequence {i}, token {j}, "
                             f"{v[i, j]:+.4g}): pass log-probabilities (nats, <= 0), not probabilities or logits")


def step_rows(r: StepRecord, trainer_version: int, *, old_var: str, theta_var: str,
              sampling: Mapping[str, Any]) -> tuple[dict[str, Any], StepArrays]:
    """A step's arrays checked (a ValueError says what does not fit) and padded, as the run store's
    rows and as the metrics' arrays.

    Parameters
    ----------
    r : StepRecord
        The step.
    trainer_version : int
        The trainer's policy version at this step (the default of the per-token versions).
    old_var, theta_var : str
        The variables the trainer's pi_old and pi_theta are stored as.
    sampling : Mapping[str, Any]
        The recorder's ``temperature``, ``top_k`` and ``top_p``: each sequence's default.

    Returns
    -------
    rows : dict[str, tuple]
        ``{name: (dims, values)}`` for :meth:`rlparity.record.store.RunWriter.write_step`.
    arrays : StepArrays
        The step for :func:`~rlparity.record.live.step_metrics` and the alarms.
    """
    mask_in = None if r.response_mask is None else np.asarray(_numpy(r.response_mask), bool)
    tok_rows = _rows(r.token_ids, mask_in, "token_ids")
    lengths = np.array([len(t) for t in tok_rows], np.int64)
    # at least one position: a step whose responses are all empty still writes its (padding) chunks
    n, width = len(tok_rows), max(1, int(lengths.max(initial=0)))
    mask = np.arange(width)[None, :] < lengths[:, None]

    per_token = functools.partial(_per_token, mask=mask, mask_in=mask_in, lengths=lengths)
    f64 = {name: per_token(value, name, np.nan, np.float64)
           for name, value in (("rollout_logprobs", r.rollout_logprobs), ("trainer_logprobs", r.trainer_logprobs),
                               ("trainer_updated_logprobs", r.trainer_updated_logprobs)) if value is not None}
    _refuse_positive(f64, mask)  # the trace schema's rule: a step the readers would refuse is refused here
    tok = pad_rows(tok_rows, -1, np.int64, width)
    pmask = None if r.prompt_mask is None else np.asarray(_numpy(r.prompt_mask), bool)
    prompt_rows = _rows(r.prompt_token_ids, pmask, "prompt_token_ids")
    if len(prompt_rows) != n:
        raise ValueError(f"prompt_token_ids has {len(prompt_rows)} sequences, token_ids {n}: pass one prompt per "
                         "sequence (repeat a group's prompt for each of its samples)")
    prompt = pad_rows(prompt_rows, -1, np.int64)
    plen = np.array([len(p) for p in prompt_rows], np.int64)
    pv = per_token(trainer_version if r.policy_versions is None else r.policy_versions, "policy_versions", -1,
                   np.int64)
    sv = per_token(trainer_version if r.scored_version is None else r.scored_version, "scored_version", -1,
                   np.int64)
    rewards = None if r.rewards is None else _per_seq(r.rewards, n, np.float64, np.nan, "rewards")
    adv = None if r.advantages is None else _per_seq(r.advantages, n, np.float64, np.nan, "advantages")
    reasons = list(r.finish_reasons) if r.finish_reasons is not None else ["unknown"] * n
    if len(reasons) != n:
        raise ValueError(f"finish_reasons has {len(reasons)} entries for {n} sequences: give one per sequence")
    codes = np.array([FINISH_REASONS.index(x) if x in FINISH_REASONS else 0 for x in reasons], np.int8)
    rows: dict[str, Any] = {
        "token_id": (("sequence", "position"), tok),
        "policy_version": (("sequence", "position"), pv),
        "scored_version": (("sequence", "position"), sv),
        "rollout_logprob": (("sequence", "position"), f64["rollout_logprobs"]),
        old_var: (("sequence", "position"), f64["trainer_logprobs"]),
        "prompt_token_id": (("sequence", "prompt_position"), prompt),
        "prompt_length": (("sequence",), plen),
        "response_length": (("sequence",), lengths),
        "prompt_index": (("sequence",), _per_seq(r.prompt_index, n, np.int64, np.arange(n), "prompt_index")),
        "finish_reason": (("sequence",), codes),
        "temperature": (("sequence",), _per_seq(r.temperature, n, np.float64, sampling["temperature"],
                                                "temperature")),
        "top_k": (("sequence",), _per_seq(r.top_k, n, np.int64, sampling["top_k"], "top_k")),
        "top_p": (("sequence",), _per_seq(r.top_p, n, np.float64, sampling["top_p"], "top_p")),
        "reward": (("sequence",), rewards if rewards is not None else np.full(n, np.nan)),
        "advantage": (("sequence",), adv if adv is not None else np.full(n, np.nan)),
    }
    if "trainer_updated_logprobs" in f64:
        rows[theta_var] = (("sequence", "position"), f64["trainer_updated_logprobs"])
    arrays = StepArrays(log_mu=rows["rollout_logprob"][1], log_pi=rows[old_var][1], mask=mask,
                        policy_version=pv, scored_version=sv, trainer_version=trainer_version,
                        log_theta=f64.get("trainer_updated_logprobs"), rewards=rewards, advantages=adv,
                        prompt_index=rows["prompt_index"][1])
    return rows, arrays


__all__ = ["StepRecord", "step_rows"]
