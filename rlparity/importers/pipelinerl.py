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

The stream carries the rollout side only: ``rlparity score STORE --model MODEL`` adds the trainer
and checks the engine's prompt ids against the prompt text (``text[:-n_predicted]``, tokenized with
special tokens as ``make_training_text`` does). One arm per (launch, topic): ``actor`` (split
``train``) and ``actor_test`` (split ``eval``), every instance/partition file of a topic together;
samples are grouped by ``group_id``, ``metadata.rollout_index`` is the sample index. The
``FileStreamWriter`` (``pipelinerl/streams.py``) writes with orjson, which turns a non-finite
logprob into ``null``: refused on a predicted token, with its file and line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from rlparity.importers.errors import ImportFormatError
from rlparity.importers.records import ArmKey, Record
from rlparity.importers.values import as_int, as_reward, floats, ints, need, safe_arm
from rlparity.importers.formats import Format, ReadContext
from rlparity.importers.jsonl import iter_jsonl, jsonl_files

MASKED = -100
NAMES = {"rollout": "logprobs", "trainer": "trainer logprob", "entropy": "entropy"}
PROMPT_TOKENIZATION = {
    "add_special_tokens": True,
    "source": "ServiceNow/PipelineRL pipelinerl/async_llm.py make_training_text: prompt ids = "
              "apply_chat_template(messages, add_special_tokens=True); text has the BOS stripped, the prompt text is "
              "text[:-n_predicted]"}


def _topic(file: Path) -> tuple[Path | None, str | None]:
    """``(exp folder, topic)`` of a stream file ``<exp>/streams/<topic>/<instance>/<partition>/0.jsonl``."""
    parts = file.parts
    if "streams" in parts[:-1]:
        i = len(parts) - 1 - parts[::-1].index("streams")
        if i + 1 < len(parts) - 1:
            return Path(*parts[:i]), parts[i + 1]
    return None, None


def launch_of(file: Path) -> Path:
    """The launch folder of a stream file: the experiment folder above ``streams``, else the file's folder.

    Parameters
    ----------
    file : pathlib.Path
        A stream file (``<exp>/streams/<topic>/<instance>/<partition>/0.jsonl``).

    Returns
    -------
    pathlib.Path
        The experiment folder, or ``file.parent`` outside a ``streams`` layout.
    """
    exp, _ = _topic(file)
    return exp if exp is not None else file.parent


def _key(file: Path) -> ArmKey:
    """The actor writes training rollouts to topic ``actor`` and test rollouts to ``actor_test``
    (``pipelinerl/actor.py``); every instance/partition file of a topic is one arm."""
    _, topic = _topic(file)
    if topic is None:
        return ArmKey(label=safe_arm(file.stem))
    return ArmKey(label=safe_arm(topic), split="eval" if topic.endswith("_test") else "train")


def _prompt_text(text: dict, where: str) -> str | None:
    full = text.get("text")
    if not isinstance(full, str):
        return None
    k = as_int(text.get("n_predicted"), where, "n_predicted", hi=len(full))
    return None if k is None else (full[: len(full) - k] or None)


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    """Read one PipelineRL actor stream (``.jsonl`` of ``TrainingText`` objects) file into records.

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
        the field).
    """
    key = _key(file)
    what = "a PipelineRL TrainingText has input_ids, labels, logprobs"
    for lineno, obj in iter_jsonl(file, ctx.advance):
        group = obj if isinstance(obj, list) else [obj]
        for j, text in enumerate(group):
            where = f"{file}:{lineno}" + (f" (text {j})" if len(group) > 1 else "")
            if not isinstance(text, dict):
                raise ImportFormatError(f"{where}: expected a TrainingText object, got {type(text).__name__}")
            ids = ints(need(text, "input_ids", where, what), where, "input_ids")
            labels = ints(need(text, "labels", where, what), where, "labels")
            # FileStreamWriter writes with orjson, which turns a non-finite logprob into null
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
            if not isinstance(meta, dict):
                raise ImportFormatError(f"{where}: field 'metadata' is {type(meta).__name__}, not an object")
            finished = text.get("finished")
            if finished is not None and not isinstance(finished, bool):
                raise ImportFormatError(f"{where}: field 'finished' is {finished!r}, not true/false")
            gid = text.get("group_id")
            yield Record(
                key=key, where=where, ids=ids, sampled=sampled, rollout=rollout,
                version=as_int(meta.get("model_version"), where, "metadata.model_version"),
                reward=as_reward(text.get("reward"), where),
                finish_reason=None if finished is None else ("stop" if finished else "length"),
                prompt_index=gid if isinstance(gid, str) else f"{file}:{lineno}",
                sample_index=as_int(meta.get("rollout_index"), where, "metadata.rollout_index"),
                prompt_text=_prompt_text(text, where), names=NAMES)


def find_files(path: Path) -> list[Path]:
    """The actor streams (topics ``actor``, ``actor_test``) under ``path``.

    Parameters
    ----------
    path : pathlib.Path
        A file (returned as is) or a folder.

    Returns
    -------
    list of pathlib.Path
        The actor streams, or any ``.jsonl`` when the files are not in a ``streams`` folder, in
        natural order.
    """
    files = jsonl_files(path, "*.jsonl")
    if path.is_file():
        return files
    topics = {f: _topic(f)[1] for f in files}
    if any(t is not None for t in topics.values()):
        files = [f for f in files if (topics[f] or "").startswith("actor")]
    return files


FORMAT = Format(
    name="pipelinerl", description="PipelineRL actor streams, streams/actor/0/0/0.jsonl (rollout side only)",
    find_files=find_files, read_file=read_file, trainer=None, launch_of=launch_of, shards=True,
    prompt_tokenization=PROMPT_TOKENIZATION)
