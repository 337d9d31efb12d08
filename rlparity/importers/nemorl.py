"""NeMo-RL training-data logs, ``<log_dir>/train_data_step{N}.jsonl``.

Read from NVIDIA-NeMo/RL:

* ``nemo_rl/algorithms/grpo.py`` (logging block): ``content``, ``rewards``, ``input_lengths``,
  ``token_ids`` (= ``train_data["input_ids"]``, right-padded to the batch), ``token_loss_mask``,
  ``sample_loss_mask``, ``advantages``, ``generation_logprobs`` (the engine's) and
  ``prev_logprobs`` (the trainer's pi_old), all per token aligned with ``token_ids``.
* ``nemo_rl/utils/logger.py`` (``log_batched_dict_as_jsonl``): one line per sample from a
  micro-batch of size 1, so every field keeps a leading batch dimension of 1
  (``"token_ids": [[...]]``, ``"rewards": [0.5]``) plus ``idx`` (a row counter: GRPO groups are
  found from identical prompt ids instead); both that and flat fields are read. ``json.dumps``
  defaults: non-finite values are written ``NaN`` / ``-Infinity``.
* ``sample_loss_mask`` 0 (a filtered sample, or one over ``grpo.seq_logprob_error_threshold``,
  ``compute_and_apply_seq_logprob_error_masking``): NeMo-RL's ``token_mult_prob_error`` leaves it
  out, and so does rlparity (counted in ``attrs["import"]["excluded"]``, said by the import).
* A 2-d ``rewards`` (several components per sample) has no single sequence reward: NaN, noted.
* ``content`` (chat-templated message texts): the messages before the first assistant turn are
  the prompt text, tokenized without special tokens (``nemo_rl/data/processors.py``) when
  ``rlparity score`` checks the engine's prompt ids. A distillation log (``content`` and
  ``input_lengths`` only) is refused as text-only. One arm per (launch, step): two launches
  (``logs/exp_001``, ``logs/exp_002``) give two arms.
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

import numpy as np

from rlparity.importers.errors import ImportFormatError
from rlparity.importers.reading import TrainerSpec
from rlparity.importers.records import ArmKey, Record
from rlparity.importers.values import as_int, as_number, as_reward, floats, ints, need, safe_arm, same_length
from rlparity.importers.formats import Format, ReadContext
from rlparity.importers.jsonl import iter_jsonl, jsonl_files

SOURCE = "NVIDIA-NeMo/RL"
TRAINER = TrainerSpec(
    field="prev_logprobs", applies=frozenset({"temperature", "top_k", "top_p"}),
    source=f"{SOURCE} nemo_rl/models/policy/workers/dtensor_policy_worker.py (_apply_temperature_scaling, "
           "TrainingSamplingParams) and nemo_rl/distributed/model_utils.py (top-k/top-p filtering)",
    note="NeMo-RL computes prev_logprobs with the generation temperature, top-k and top-p applied and renormalised")


NAMES = {"rollout": "generation_logprobs", "trainer": "prev_logprobs", "entropy": "entropy"}
SAMPLE_MASKED = ("sample_loss_mask_0",
                 "sample_loss_mask 0: NeMo-RL trains nothing of these samples (filtered, e.g. by dynamic sampling, or "
                 "over grpo.seq_logprob_error_threshold: the worst mismatches may be among them)")
PROMPT_TOKENIZATION = {
    "add_special_tokens": False,
    "source": f"{SOURCE} nemo_rl/data/processors.py: each message's token_ids = tokenizer(content, "
              "add_special_tokens=False), content already chat-templated; the prompt is the messages before the "
              "first assistant turn (nemo_rl/experience/rollouts.py appends an environment message after every "
              "assistant turn)"}


def _unbatch(value: Any, nested: bool) -> Any:
    """Drop the leading batch dimension of 1 that NeMo-RL's logger keeps."""
    if isinstance(value, list) and len(value) == 1 and (not nested or isinstance(value[0], list)):
        return value[0]
    return value


def _reward(value: Any, where: str) -> tuple[float | None, str | None]:
    """The sample's reward; several components (a 2-d ``rewards``) have no single value."""
    value = _unbatch(value, False)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value):
        return None, (f"rewards has {len(value)} components per sample (a 2-d rewards): no single sequence reward, "
                      "reward stored as NaN")
    return as_reward(value, where, "rewards"), None


def _prompt_text(content: Any, turns: int) -> str | None:
    """The chat-templated prompt: the message contents before the first assistant turn (each of
    the ``turns`` assistant messages is followed by an environment message)."""
    if not isinstance(content, list) or not all(isinstance(c, str) for c in content):
        return None
    k = len(content) - 2 * turns
    return "".join(content[:k]) if k >= 1 else None


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    """Read one NeMo-RL ``train_data_step{N}.jsonl`` file into records.

    Parameters
    ----------
    file : pathlib.Path
        The file.
    ctx : ReadContext
        Its ``advance`` is called with the bytes read (progress).

    Yields
    ------
    Record
        One record per sample of the file.

    Raises
    ------
    ImportFormatError
        If the file or a record is malformed (the message names the file, the line or sample and
        the field); a text-only or distillation log is named as such.
    """
    m = re.search(r"step(\d+)", file.stem)
    step = int(m.group(1)) if m else None
    key = ArmKey(label=f"step_{step}" if step is not None else safe_arm(file.stem), step=step)
    what = "a NeMo-RL train_data row has token_ids, token_loss_mask, generation_logprobs, prev_logprobs"
    for lineno, obj in iter_jsonl(file, ctx.advance):
        where = f"{file}:{lineno}"
        if not isinstance(obj, dict):
            raise ImportFormatError(f"{where}: expected one JSON object per line (a NeMo-RL train_data row), "
                                    f"got {type(obj).__name__}")
        if "token_ids" not in obj and "content" in obj:
            kind = ("a distillation log (nemo_rl/algorithms/distillation.py logs content and input_lengths only)"
                    if "input_lengths" in obj else "a text-only log (content, rewards)")
            raise ImportFormatError(f"{where}: this is {kind}: decoded text, no token ids or logprobs, so nothing to "
                                    "compare. Import the GRPO train_data_step*.jsonl (token_ids, generation_logprobs, "
                                    "prev_logprobs), or write the generic format (rlparity/importers/GENERIC_FORMAT.md)")
        ids = ints(_unbatch(need(obj, "token_ids", where, what), True), where, "token_ids")
        mask = ints(_unbatch(need(obj, "token_loss_mask", where, what), True), where, "token_loss_mask",
                    mask=True).astype(bool)
        rollout = floats(_unbatch(need(obj, "generation_logprobs", where, what), True), where, "generation_logprobs")
        prev = obj.get("prev_logprobs")
        trainer = floats(_unbatch(prev, True), where, "prev_logprobs") if prev is not None else None
        n = len(ids)
        length = as_int(_unbatch(obj.get("input_lengths"), False), where, "input_lengths", lo=1, hi=n)
        length = n if length is None else length
        same_length(where, n, token_loss_mask=mask, generation_logprobs=rollout, prev_logprobs=trainer)
        ids, mask, rollout = ids[:length], mask[:length], rollout[:length]
        trainer = None if trainer is None else trainer[:length]
        excluded = {}
        # a loss multiplier: 0 = the sample is not trained (any other weight keeps it)
        weight = as_number(_unbatch(obj.get("sample_loss_mask"), False), where, "sample_loss_mask",
                           "write the sample's loss weight (0 = not trained)")
        if weight == 0:
            excluded[SAMPLE_MASKED] = int(mask.sum())
            mask = np.zeros_like(mask)
        reward, note = _reward(obj.get("rewards"), where)
        turns = int(np.count_nonzero(np.diff(np.concatenate([[0], mask.astype(np.int8)])) == 1)) or 1
        yield Record(
            key=key, where=where, ids=ids, sampled=mask, rollout=rollout, trainer=trainer, reward=reward,
            prompt_text=_prompt_text(_unbatch(obj.get("content"), True), turns), excluded=excluded, names=NAMES,
            note=note, arm_info={"step": step})


def find_files(path: Path) -> list[Path]:
    """The dump files under ``path`` (the format's ``find_files``).

    Parameters
    ----------
    path : pathlib.Path
        A file (returned as is) or a folder.

    Returns
    -------
    list of pathlib.Path
        The ``train_data_step*.jsonl`` files under it, in natural order (``step_2`` before ``step_10``).
    """
    return jsonl_files(path, "train_data_step*.jsonl")


def nothing_found(path: Path) -> str:
    """A hint for a folder with no ``train_data_step*.jsonl``.

    Parameters
    ----------
    path : pathlib.Path
        The path searched.

    Returns
    -------
    str
        When the folder holds ``val_data_step*.jsonl`` only: why they cannot be imported and what
        to import instead; else ``""``.
    """
    if path.is_dir() and any(path.rglob("val_data_step*.jsonl")):
        return ("; only val_data_step*.jsonl, which hold decoded text and rewards (no token ids or logprobs): "
                "import the train_data_step*.jsonl of the same log dir")
    return ""


FORMAT = Format(
    name="nemo-rl", description="NeMo-RL training-data logs, train_data_step{N}.jsonl (both sides)",
    find_files=find_files, read_file=read_file, trainer=TRAINER, prompt_tokenization=PROMPT_TOKENIZATION,
    nothing_found=nothing_found)
