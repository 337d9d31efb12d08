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
* ``loss_mask`` marks the trained tokens (the prompt and tool/user tokens are False). With the
  component weight streams (``rl_weights``, ``ce_weights``, ``ref_kl_weights``; all-null = absent)
  prime-rl measures its mismatch only where ``loss_mask & (rl_weights != 0 | ref_kl_weights != 0)``
  (``train.py``); rlparity does the same: CE-only tokens (distillation: not sampled by the policy,
  placeholder ``inference_logprobs``) and tokens of RL weight 0 are left out of the response and
  counted per reason in ``attrs["import"]["excluded"]``.
* ``token_export._json_float`` writes every non-finite float as ``null``: a null trainer logprob
  is read as ``-inf`` (probability 0), or NaN (refused) where the entropy is null too; a null
  engine logprob on a sampled token is refused with its file and line.
* One arm per (run, launch, export step), the rank files of a step together: the step is the
  folder's ``step_N`` (``export_step`` of the multi-run trainer, commits before 289562d, which
  wrote ``<output_dir>/<run_id>/token_exports/step_N``; its ``step`` is the trainer's own step,
  kept as ``trainer_step``), the run is ``run_id``. Samples are grouped by identical prompt ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from rlparity.importers.errors import ImportFormatError
from rlparity.importers.reading import TrainerSpec
from rlparity.importers.records import ArmKey, Record
from rlparity.importers.values import as_int, floats, ints, need, safe_arm, same_length
from rlparity.importers.formats import Format, ReadContext
from rlparity.importers.jsonl import iter_jsonl, jsonl_files

SOURCE = "PrimeIntellect-ai/prime-rl"
TRAINER = TrainerSpec(
    field="trainer_logprobs", applies=frozenset({"temperature"}),
    source=f"{SOURCE} src/prime_rl/trainer/rl/train.py: selective_log_softmax(logits / temperatures), "
           "no top-k/top-p; entropy of the same tempered distribution",
    note="prime-rl computes trainer_logprobs at each token's sampling temperature over the full vocabulary")


TOP_P_SOURCE = (f"{SOURCE} packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py: "
                "SamplingConfig.to_sampling_args sends top_p=1.0 with every training request")


NAMES = {"rollout": "inference_logprobs", "trainer": "trainer_logprobs", "entropy": "entropy"}
EXCLUDED_CE = ("ce_only", "CE-only tokens (ce_weights set, rl_weights 0): tokens the policy did not sample (e.g. a frozen "
               "model's, for distillation), whose inference_logprobs are placeholders")
EXCLUDED_ZERO = ("rl_weight_0", "rl_weights 0 (e.g. zero-advantage tokens): prime-rl leaves them out of its mismatch metric "
                 "(train.py: mismatch_mask = loss_mask & (rl_weights != 0 | ref_kl_weights != 0))")


def launch_of(file: Path) -> Path:
    """The folder holding ``token_exports``: the trainer's output_dir, or a run's folder in the multi-run layout.

    Parameters
    ----------
    file : pathlib.Path
        An export file (``.../token_exports/step_N/rank_R.jsonl``).

    Returns
    -------
    pathlib.Path
        The parent of ``token_exports``; outside that layout the folder above a ``step_N``
        folder, else the file's folder.
    """
    for parent in file.parents:
        if parent.name == "token_exports":
            return parent.parent
    return file.parent.parent if re.fullmatch(r"step_\d+", file.parent.name) else file.parent


def _key(file: Path, obj: dict, where: str) -> tuple[ArmKey, dict]:
    """The arm of a record: the export step (``export_step`` of the multi-run trainer, else the
    ``step_N`` folder, else the record's ``step``) and the run (``run_id``)."""
    trainer_step = as_int(obj.get("step"), where, "step")
    step = as_int(obj.get("export_step"), where, "export_step")
    m = re.fullmatch(r"step_(\d+)", file.parent.name)
    if step is None:
        step = int(m.group(1)) if m else trainer_step
    run = obj.get("run_id")
    if run is not None and not isinstance(run, str):
        raise ImportFormatError(f"{where}: field 'run_id' is {type(run).__name__} {run!r}, not a run name")
    info = {"rank": as_int(obj.get("rank"), where, "rank"), "trainer_step": trainer_step,
            "schema_version": as_int(obj.get("schema_version"), where, "schema_version")}
    label = f"step_{step}" if step is not None else safe_arm(file.stem)
    return ArmKey(label=label, step=step, run=run), info


def _weights(obj: dict, name: str, where: str) -> np.ndarray | None:
    """A component weight stream; ``None`` when absent (prime-rl writes ``[null, ...]`` then)."""
    v = obj.get(name)
    if v is None or isinstance(v, list) and v.count(None) == len(v):
        return None
    w = floats(v, where, name)
    if np.isnan(w).all():
        return None
    if np.isnan(w).any():
        raise ImportFormatError(f"{where}: {name} mixes numbers and nulls: prime-rl writes a whole stream or "
                                "none (null = absent)")
    return w


def _rl_tokens(obj: dict, loss: np.ndarray, where: str) -> tuple[np.ndarray, dict[tuple[str, str], np.ndarray]]:
    """The tokens prime-rl measures the mismatch on, and the loss tokens it leaves out (by reason)."""
    rl, ce, ref_kl = (_weights(obj, k, where) for k in ("rl_weights", "ce_weights", "ref_kl_weights"))
    if rl is None and ref_kl is None:
        return loss, {}
    sampled = (rl != 0) if rl is not None else loss.copy()
    if ref_kl is not None:
        sampled |= ref_kl != 0
    keep = loss & sampled
    out = loss & ~sampled
    ce_only = out & (ce != 0) if ce is not None else np.zeros_like(out)
    return keep, {EXCLUDED_CE: ce_only, EXCLUDED_ZERO: out & ~ce_only}


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    """Read one prime-rl token export (``rank_R.jsonl``) file into records.

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
    for lineno, obj in iter_jsonl(file, ctx.advance):
        where = f"{file}:{lineno}"
        if not isinstance(obj, dict):
            raise ImportFormatError(f"{where}: expected one JSON object per line (a prime-rl token export record), "
                                    f"got {type(obj).__name__}")
        key, info = _key(file, obj, where)
        what = "a prime-rl token export record has token_ids, loss_mask, inference_logprobs, trainer_logprobs"
        ids = ints(need(obj, "token_ids", where, what), where, "token_ids")
        loss = ints(need(obj, "loss_mask", where, what), where, "loss_mask", mask=True).astype(bool)
        rollout = floats(need(obj, "inference_logprobs", where, what), where, "inference_logprobs")
        # prime-rl writes every non-finite float as null (token_export._json_float): a trainer null
        # is -inf (a probability-0 token), unless the entropy there is null too (NaN: a broken forward)
        trainer = (floats(obj["trainer_logprobs"], where, "trainer_logprobs", null=-np.inf)
                   if obj.get("trainer_logprobs") is not None else None)
        entropy = floats(obj["entropy"], where, "entropy") if obj.get("entropy") is not None else None
        pos = ints(obj["position_ids"], where, "position_ids") if obj.get("position_ids") is not None else None
        n = len(ids)
        same_length(where, n, loss_mask=loss, inference_logprobs=rollout, trainer_logprobs=trainer,
                    entropy=entropy, position_ids=pos)
        if trainer is not None and entropy is not None:
            trainer[np.isneginf(trainer) & np.isnan(entropy)] = np.nan
        sampled, excluded = _rl_tokens(obj, loss, where)
        # packed samples: position_ids restart at 0 where a new sample begins
        starts = [0] if pos is None else sorted({0, *np.flatnonzero(pos == 0).tolist()})
        bounds = list(zip(starts, starts[1:] + [n]))
        for k, (s, e) in enumerate(bounds):
            sub = f"{where} (packed sample {k})" if len(bounds) > 1 else where
            yield Record(
                key=key, where=sub, ids=ids[s:e], sampled=sampled[s:e], rollout=rollout[s:e],
                trainer=None if trainer is None else trainer[s:e], entropy=None if entropy is None else entropy[s:e],
                excluded={reason: int(m[s:e].sum()) for reason, m in excluded.items()}, names=NAMES, arm_info=info)


def find_files(path: Path) -> list[Path]:
    """The dump files under ``path`` (the format's ``find_files``).

    Parameters
    ----------
    path : pathlib.Path
        A file (returned as is) or a folder.

    Returns
    -------
    list of pathlib.Path
        The ``rank_*.jsonl`` files under it, else any ``.jsonl``, in natural order (``step_2`` before ``step_10``).
    """
    return jsonl_files(path, "rank_*.jsonl") or ([] if path.is_file() else jsonl_files(path, "*.jsonl"))


FORMAT = Format(
    name="prime-rl", description="prime-rl trainer token exports, token_exports/step_N/rank_R.jsonl (both sides)",
    find_files=find_files, read_file=read_file, trainer=TRAINER,
    framework_sampling={"top_p": (1.0, TOP_P_SOURCE)}, launch_of=launch_of, shards=True)
