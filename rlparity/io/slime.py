"""slime debug dumps (``--save-debug-rollout-data``, ``--save-debug-train-data``), ``.pt`` files.

Read with ``torch.load(path, weights_only=True)`` only (tensor storages memory-mapped): a file
that holds Python objects only full pickle can rebuild is refused, never unpickled.

Read from THUDM/slime:

* ``slime/observability/rollout_data_utils.py`` (``save_debug_rollout_data``):
  ``{"rollout_id": int, "samples": [Sample.to_dict(), ...]}``; ``slime/utils/types.py``
  (``Sample``): ``tokens`` = prompt + response, ``response_length``, ``loss_mask`` (one entry per
  response token, None = all 1; tool tokens of multi-turn samples are 0), ``rollout_log_probs``
  (one per response token), ``weight_versions`` (one per generation call), ``reward``,
  ``status`` (``completed`` / ``truncated`` / ``aborted`` / ...).
* ``slime/observability/train_data_utils.py`` (``_build_dump_payload``, ``format_version`` 2):
  ``samples`` with the training batch's per-sample fields: ``tokens``, ``response_lengths``,
  ``loss_masks``, ``rollout_log_probs``, the trainer's ``log_probs`` (response tokens), ``rewards``,
  ``truncated``, ``rollout_position``.
* ``slime/backends/megatron_utils/loss.py`` (``get_log_probs_and_entropy``): ``log_probs`` =
  log-softmax of ``logits / rollout_temperature``, with the rollout's top-p nucleus replayed as a
  keep-mask when ``--rollout-top-p`` < 1; ``--rollout-top-k`` is not applied by the trainer.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlparity.io.common import (
    ImportFormatError,
    PickleRefusedError,
    Record,
    TrainerSpec,
    floats,
    ints,
    natural_key,
    need,
    safe_arm,
)
from rlparity.io.formats import Format, ReadContext

SOURCE = "THUDM/slime"
TRAINER = TrainerSpec(
    field="log_probs", applies=frozenset({"temperature", "top_p"}),
    source=f"{SOURCE} slime/backends/megatron_utils/loss.py (get_log_probs_and_entropy: logits / rollout_temperature, "
           "top-p nucleus replay; no top-k)",
    note="slime computes log_probs at --rollout-temperature, replaying the rollout's top-p nucleus")
STATUS = {"completed": "stop", "truncated": "length", "aborted": "abort"}


def load_weights_only(file: Path) -> Any:
    """``torch.load(file, weights_only=True)`` (memory-mapped when the file allows it); a file
    that needs full pickle raises :class:`PickleRefusedError` saying why."""
    import torch

    def refuse(err: Exception) -> PickleRefusedError:
        text = str(err)
        m = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"global[^\w]+([\w.]+)", text)
        what = f"a {m.group(1)} object" if m else "Python objects"
        return PickleRefusedError(
            f"{file}: refused: it holds {what}, which only full pickle can rebuild, and unpickling runs code "
            "stored in the file. rlparity loads .pt files with torch.load(weights_only=True) only and never falls "
            "back to pickle. Save plain containers instead (dicts, lists, numbers, strings, tensors: slime's "
            "Sample.to_dict()), or write the generic format (rlparity/io/GENERIC_FORMAT.md)")

    for mmap in (True, False):
        try:
            return torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as err:
            raise refuse(err) from None
        except RuntimeError as err:
            if "Weights only load failed" in str(err):
                raise refuse(err) from None
            if mmap and "mmap" in str(err):
                continue  # an old (non-zip) torch.save file: no memory map, still weights_only
            raise ImportFormatError(f"{file}: not a torch.save file torch can read ({err})") from None
        except Exception as err:  # zip errors, EOF on a truncated file
            raise ImportFormatError(f"{file}: not a torch.save file torch can read ({type(err).__name__}: {err})") from None
    raise AssertionError("unreachable")


def _versions(value: Any) -> list[int] | None:
    if not value:
        return None
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        return None


def _reward(value: Any) -> float | None:
    if value is None or isinstance(value, dict):
        return None
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    data = load_weights_only(file)
    if not isinstance(data, dict) or not isinstance(data.get("samples"), (list, tuple)):
        raise ImportFormatError(f"{file}: expected a slime debug dump, a dict with a 'samples' list "
                                f"(got {type(data).__name__}{' with keys ' + str(sorted(data)[:8]) if isinstance(data, dict) else ''})")
    train = data.get("format_version") is not None or any("log_probs" in s for s in data["samples"][:1] if isinstance(s, dict))
    rid = data.get("rollout_id")
    rid = rid if isinstance(rid, (int, str)) else None
    arm = safe_arm(f"rollout_{rid}" + ("_train" if train else "")) if rid is not None else safe_arm(file.stem)
    info = {"file": str(file), "step": rid, "rank": data.get("rank"), "dump": "train" if train else "rollout",
            "format_version": data.get("format_version")}
    samples = data["samples"]
    size = file.stat().st_size
    done = 0
    group_count: dict[Any, int] = {}
    for i, s in enumerate(samples):
        where = f"{file} [sample {i}]"
        if not isinstance(s, dict):
            raise ImportFormatError(f"{where}: expected a dict (Sample.to_dict()), got {type(s).__name__}")
        what = "a slime sample has tokens, response_length(s), rollout_log_probs"
        ids = ints(need(s, "tokens", where, what), where, "tokens")
        rlen_key = "response_lengths" if "response_lengths" in s else "response_length"
        rlen = int(need(s, rlen_key, where, what))
        n = len(ids)
        if not 0 <= rlen <= n:
            raise ImportFormatError(f"{where}: {rlen_key}={rlen} but tokens has {n} entries")
        p = n - rlen
        lm_key = "loss_masks" if "loss_masks" in s else "loss_mask"
        lm = s.get(lm_key)
        lm = np.ones(rlen, dtype=np.int64) if lm is None else ints(lm, where, lm_key)
        if len(lm) != rlen:
            raise ImportFormatError(f"{where}: {lm_key} has {len(lm)} entries but {rlen_key} is {rlen}")
        if s.get("rollout_log_probs") is None:
            raise ImportFormatError(f"{where}: no rollout_log_probs: the rollout engine's logprobs were not kept "
                                    "(slime keeps them when the rollout returns logprobs, e.g. for TIS/off-policy correction)")
        rlp = floats(s["rollout_log_probs"], where, "rollout_log_probs")
        if len(rlp) != rlen:
            raise ImportFormatError(f"{where}: rollout_log_probs has {len(rlp)} entries but {rlen_key} is {rlen}")
        sampled = np.zeros(n, dtype=bool)
        sampled[p:] = lm.astype(bool)
        rollout = np.full(n, np.nan)
        rollout[p:] = rlp
        trainer = None
        if train:
            if s.get("log_probs") is None:
                raise ImportFormatError(f"{where}: a train dump sample without the trainer's log_probs")
            tlp = floats(s["log_probs"], where, "log_probs")
            if len(tlp) != rlen:
                raise ImportFormatError(f"{where}: log_probs has {len(tlp)} entries but {rlen_key} is {rlen}")
            trainer = np.full(n, np.nan)
            trainer[p:] = tlp
        if train:
            finish = "length" if int(s.get("truncated") or 0) else None
        else:
            finish = STATUS.get(str(s.get("status")))
        group = s.get("group_index")
        pos = s.get("rollout_position", s.get("sample_index", i))
        prompt_index = int(group) if group is not None else int(pos if pos is not None else i)
        sample_index = group_count.get(group, 0) if group is not None else 0
        group_count[group] = sample_index + 1
        yield Record(
            arm=arm, where=where, ids=ids, sampled=sampled, rollout=rollout, trainer=trainer,
            turn_versions=_versions(s.get("weight_versions")), reward=_reward(s.get("rewards", s.get("reward"))),
            finish_reason=finish, prompt_index=prompt_index, sample_index=sample_index, arm_info=info)
        step = (size * (i + 1)) // len(samples) - done
        done += step
        ctx.advance(step)


def find_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted((p for p in path.rglob("*.pt") if p.is_file()), key=natural_key)


FORMAT = Format(
    name="slime", description="slime debug rollout/train data, .pt (torch.load weights_only; rollout side, "
                              "the train dump adds the trainer's log_probs)",
    find_files=find_files, read_file=read_file, trainer=TRAINER)
