"""prime-rl trainer token exports (``trainer.enable_token_export = true``).

Files: ``<output_dir>/token_exports/step_<N>/rank_<R>.jsonl`` (``schema_version`` 1), one JSON
object per exported sequence: ``token_ids``, ``position_ids``, ``loss_mask``,
``inference_logprobs`` (the engine's), ``trainer_logprobs``, ``entropy``, ... all aligned with
``token_ids`` (the value at ``i`` is about token ``i``; prompt positions hold placeholders).

Read from PrimeIntellect-ai/prime-rl:

* ``src/prime_rl/trainer/rl/token_export.py``: one record per micro-sequence, cut by
  ``sequence_lengths``; records of older versions may hold several packed samples, so a record is
  cut again wherever ``position_ids`` restart at 0.
* ``src/prime_rl/trainer/rl/train.py``: ``trainer_logprobs = selective_log_softmax(logits /
  temperatures)`` (per-token sampling temperatures; no top-k/top-p), shifted right to align with
  the ids, and ``entropy`` of the same tempered distribution: the processed reading when the
  sampler cut nothing.
* ``packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py``: training requests send
  ``top_p=1.0``; the temperature (default 1.0) is a config value the export does not record;
  ``top_k`` is sent only through ``extra_body``.
* ``loss_mask`` marks the tokens the engine sampled (the prompt and tool/user tokens are False).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from rlparity.io.common import ImportFormatError, Record, TrainerSpec, floats, ints, need, safe_arm, same_length
from rlparity.io.formats import Format, ReadContext
from rlparity.io.jsonl import iter_jsonl, jsonl_files

SOURCE = "PrimeIntellect-ai/prime-rl"
TRAINER = TrainerSpec(
    field="trainer_logprobs", applies=frozenset({"temperature"}),
    source=f"{SOURCE} src/prime_rl/trainer/rl/train.py: selective_log_softmax(logits / temperatures), "
           "no top-k/top-p; entropy of the same tempered distribution",
    note="prime-rl computes trainer_logprobs at each token's sampling temperature over the full vocabulary")


TOP_P_SOURCE = (f"{SOURCE} packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py: "
                "SamplingConfig.to_sampling_args sends top_p=1.0 with every training request")


def _arm(file: Path, obj: dict) -> tuple[str, dict]:
    step = obj.get("step")
    rank = obj.get("rank")
    m = re.search(r"step_(\d+)", file.parent.name)
    if step is None and m:
        step = int(m.group(1))
    m = re.search(r"rank_(\d+)", file.stem)
    if rank is None and m:
        rank = int(m.group(1))
    if step is None:
        return safe_arm(file.stem), {"file": str(file)}
    return safe_arm(f"step_{step}" + (f"_rank_{rank}" if rank is not None else "")), \
        {"file": str(file), "step": int(step), "rank": None if rank is None else int(rank)}


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    arm = info = None
    sample = 0
    for lineno, obj in iter_jsonl(file, ctx.advance):
        where = f"{file}:{lineno}"
        if not isinstance(obj, dict):
            raise ImportFormatError(f"{where}: expected one JSON object per line (a prime-rl token export record), "
                                    f"got {type(obj).__name__}")
        if arm is None:
            arm, info = _arm(file, obj)
        what = "a prime-rl token export record has token_ids, loss_mask, inference_logprobs, trainer_logprobs"
        ids = ints(need(obj, "token_ids", where, what), where, "token_ids")
        mask = ints(need(obj, "loss_mask", where, what), where, "loss_mask").astype(bool)
        rollout = floats(need(obj, "inference_logprobs", where, what), where, "inference_logprobs")
        trainer = floats(obj["trainer_logprobs"], where, "trainer_logprobs") if obj.get("trainer_logprobs") is not None else None
        entropy = floats(obj["entropy"], where, "entropy") if obj.get("entropy") is not None else None
        pos = ints(obj["position_ids"], where, "position_ids") if obj.get("position_ids") is not None else None
        n = len(ids)
        same_length(where, n, loss_mask=mask, inference_logprobs=rollout, trainer_logprobs=trainer,
                    entropy=entropy, position_ids=pos)
        # packed samples: position_ids restart at 0 where a new sample begins
        starts = [0] if pos is None else sorted({0, *np.flatnonzero(pos == 0).tolist()})
        bounds = list(zip(starts, starts[1:] + [n]))
        for k, (s, e) in enumerate(bounds):
            sub = f"{where} (packed sample {k})" if len(bounds) > 1 else where
            yield Record(
                arm=arm, where=sub, ids=ids[s:e], sampled=mask[s:e], rollout=rollout[s:e],
                trainer=None if trainer is None else trainer[s:e], entropy=None if entropy is None else entropy[s:e],
                prompt_index=sample, sample_index=0, arm_info=info)
            sample += 1


def find_files(path: Path) -> list[Path]:
    return jsonl_files(path, "rank_*.jsonl") or ([] if path.is_file() else jsonl_files(path, "*.jsonl"))


FORMAT = Format(
    name="prime-rl", description="prime-rl trainer token exports, token_exports/step_N/rank_R.jsonl (both sides)",
    find_files=find_files, read_file=read_file, trainer=TRAINER,
    framework_sampling={"top_p": (1.0, TOP_P_SOURCE)})
