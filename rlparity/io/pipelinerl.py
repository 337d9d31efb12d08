"""PipelineRL actor streams, ``<exp>/streams/actor/<instance>/<partition>/0.jsonl``.

Read from ServiceNow/PipelineRL:

* ``pipelinerl/actor.py``: each line is one group: a list of ``TrainingText.model_dump()``;
  ``metadata.model_version`` is the trainer's weight version when the rollout started.
* ``pipelinerl/rollouts.py`` (``TrainingText``) and ``pipelinerl/async_llm.py``
  (``make_training_text``): ``input_ids`` = prompt ids + generated ids, ``labels`` = -100 on the
  prompt, ``logprobs`` = the engine's logprob of each generated token; ``finished`` is False when
  generation stopped at the length limit.
* ``conf/base.yaml``: vLLM runs with ``logprobs-mode: processed_logprobs``; the sampling
  temperature (``llm.parameters``) is not in the stream.

The stream carries the rollout side only: ``rlparity score STORE --model MODEL`` adds the trainer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from rlparity.io.common import ImportFormatError, Record, floats, ints, need, safe_arm
from rlparity.io.formats import Format, ReadContext
from rlparity.io.jsonl import iter_jsonl, jsonl_files

MASKED = -100


def _arm(file: Path) -> str:
    parts = file.with_suffix("").parts
    if "streams" in parts:
        return safe_arm("_".join(parts[parts.index("streams") + 1:]))
    return safe_arm(file.stem)


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    arm = _arm(file)
    info = {"file": str(file)}
    what = "a PipelineRL TrainingText has input_ids, labels, logprobs"
    for lineno, obj in iter_jsonl(file, ctx.advance):
        group = obj if isinstance(obj, list) else [obj]
        for j, text in enumerate(group):
            where = f"{file}:{lineno}" + (f" (text {j})" if len(group) > 1 else "")
            if not isinstance(text, dict):
                raise ImportFormatError(f"{where}: expected a TrainingText object, got {type(text).__name__}")
            ids = ints(need(text, "input_ids", where, what), where, "input_ids")
            labels = ints(need(text, "labels", where, what), where, "labels")
            lps = floats(need(text, "logprobs", where, what), where, "logprobs")
            if len(labels) != len(ids):
                raise ImportFormatError(f"{where}: labels has {len(labels)} entries but input_ids {len(ids)}")
            sampled = labels != MASKED
            if int(sampled.sum()) != len(lps):
                raise ImportFormatError(
                    f"{where}: {int(sampled.sum())} predicted tokens (labels != -100) but {len(lps)} logprobs: "
                    "PipelineRL stores one engine logprob per predicted token")
            rollout = np.full(len(ids), np.nan)
            rollout[sampled] = lps
            meta = text.get("metadata") or {}
            version = meta.get("model_version")
            finished = text.get("finished")
            yield Record(
                arm=arm, where=where, ids=ids, sampled=sampled, rollout=rollout,
                version=None if version is None else int(version),
                reward=None if text.get("reward") is None else float(text["reward"]),
                finish_reason=None if finished is None else ("stop" if finished else "length"),
                prompt_index=lineno - 1, sample_index=j, arm_info=info)


def find_files(path: Path) -> list[Path]:
    return jsonl_files(path, "*.jsonl")


FORMAT = Format(
    name="pipelinerl", description="PipelineRL actor streams, streams/actor/0/0/0.jsonl (rollout side only)",
    find_files=find_files, read_file=read_file, trainer=None)
