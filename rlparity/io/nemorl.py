"""NeMo-RL training-data logs, ``<log_dir>/train_data_step{N}.jsonl``.

Read from NVIDIA-NeMo/RL:

* ``nemo_rl/algorithms/grpo.py`` (logging block): ``content``, ``rewards``, ``input_lengths``,
  ``token_ids`` (= ``train_data["input_ids"]``, right-padded to the batch), ``token_loss_mask``,
  ``sample_loss_mask``, ``advantages``, ``generation_logprobs`` (the engine's) and
  ``prev_logprobs`` (the trainer's pi_old), all per token aligned with ``token_ids``.
* ``nemo_rl/utils/logger.py`` (``log_batched_dict_as_jsonl``): one line per sample from a
  micro-batch of size 1, so every field keeps a leading batch dimension of 1
  (``"token_ids": [[...]]``, ``"rewards": [0.5]``) plus ``idx``; both that and flat fields are read.
* ``nemo_rl/models/policy/workers/dtensor_policy_worker.py`` (``_apply_temperature_scaling``,
  ``TrainingSamplingParams(top_k, top_p, temperature)`` from the generation config) and
  ``nemo_rl/distributed/model_utils.py`` (top-k/top-p filtering before the log-softmax):
  ``prev_logprobs`` are the sampler's processed distribution (temperature, top-k, top-p,
  renormalised); position 0 holds a prepended 0.
* ``nemo_rl/models/generation/vllm/vllm_worker.py``: vLLM's ``logprobs_mode`` is passed only when
  ``vllm_cfg.logprobs_mode`` is set; otherwise vLLM's default (``raw_logprobs``) applies.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlparity.io.common import ImportFormatError, Record, TrainerSpec, floats, ints, need, safe_arm, same_length
from rlparity.io.formats import Format, ReadContext
from rlparity.io.jsonl import iter_jsonl, jsonl_files

SOURCE = "NVIDIA-NeMo/RL"
TRAINER = TrainerSpec(
    field="prev_logprobs", applies=frozenset({"temperature", "top_k", "top_p"}),
    source=f"{SOURCE} nemo_rl/models/policy/workers/dtensor_policy_worker.py (_apply_temperature_scaling, "
           "TrainingSamplingParams) and nemo_rl/distributed/model_utils.py (top-k/top-p filtering)",
    note="NeMo-RL computes prev_logprobs with the generation temperature, top-k and top-p applied and renormalised")


def _unbatch(value: Any, nested: bool) -> Any:
    """Drop the leading batch dimension of 1 that NeMo-RL's logger keeps."""
    if isinstance(value, list) and len(value) == 1 and (not nested or isinstance(value[0], list)):
        return value[0]
    return value


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    m = re.search(r"step(\d+)", file.stem)
    step = int(m.group(1)) if m else None
    arm = safe_arm(f"step_{step}") if step is not None else safe_arm(file.stem)
    info = {"file": str(file), "step": step}
    what = "a NeMo-RL train_data row has token_ids, token_loss_mask, generation_logprobs, prev_logprobs"
    for lineno, obj in iter_jsonl(file, ctx.advance):
        where = f"{file}:{lineno}"
        if not isinstance(obj, dict):
            raise ImportFormatError(f"{where}: expected one JSON object per line (a NeMo-RL train_data row), "
                                    f"got {type(obj).__name__}")
        ids = ints(_unbatch(need(obj, "token_ids", where, what), True), where, "token_ids")
        mask = ints(_unbatch(need(obj, "token_loss_mask", where, what), True), where, "token_loss_mask").astype(bool)
        rollout = floats(_unbatch(need(obj, "generation_logprobs", where, what), True), where, "generation_logprobs")
        prev = obj.get("prev_logprobs")
        trainer = floats(_unbatch(prev, True), where, "prev_logprobs") if prev is not None else None
        length = _unbatch(obj.get("input_lengths"), False)
        n = len(ids)
        if length is not None:
            length = int(length)
            if not 0 < length <= n:
                raise ImportFormatError(f"{where}: input_lengths={length} but token_ids has {n} entries")
        else:
            length = n
        same_length(where, n, token_loss_mask=mask, generation_logprobs=rollout, prev_logprobs=trainer)
        reward = _unbatch(obj.get("rewards"), False)
        idx = _unbatch(obj.get("idx"), False)
        yield Record(
            arm=arm, where=where, ids=ids[:length], sampled=mask[:length], rollout=rollout[:length],
            trainer=None if trainer is None else trainer[:length],
            reward=None if reward is None else float(reward),
            prompt_index=int(idx) if isinstance(idx, (int, float)) else lineno - 1, arm_info=info)


def find_files(path: Path) -> list[Path]:
    return jsonl_files(path, "train_data_step*.jsonl")


FORMAT = Format(
    name="nemo-rl", description="NeMo-RL training-data logs, train_data_step{N}.jsonl (both sides)",
    find_files=find_files, read_file=read_file, trainer=TRAINER)
