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

One arm per (launch, split, rollout id, dump): ``save_debug_rollout_data`` writes the eval dump of
rollout N to the path template with ``eval_N`` in place of N (its ``rollout_id`` is still N), so
``rollout_eval_2.pt`` is arm ``rollout_eval_2`` (split ``eval``), never merged into ``rollout_2``.
The train dump's reward is its ``raw_reward[rollout_position]`` (``rewards`` there are the
normalised ones: ``slime/ray/rollout.py``, ``_post_process_rewards``). ``remove_sample`` samples
are left out and counted. ``prompt`` (the chat-templated text, or chat messages) is kept for the
prompt-ids check of ``rlparity score``. Dumps of slime from f81ecfe to 5472cab pickle
``Sample.SpecInfo`` objects: refused, naming the class and those versions.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlparity.importers.errors import ImportFormatError, PickleRefusedError
from rlparity.importers.reading import TrainerSpec
from rlparity.importers.records import ArmKey, Record
from rlparity.importers.values import as_int, as_reward, floats, ints, natural_key, need, safe_arm
from rlparity.importers.formats import Format, ReadContext

SOURCE = "THUDM/slime"
TRAINER = TrainerSpec(
    field="log_probs", applies=frozenset({"temperature", "top_p"}),
    source=f"{SOURCE} slime/backends/megatron_utils/loss.py (get_log_probs_and_entropy: logits / rollout_temperature, "
           "top-p nucleus replay; no top-k)",
    note="slime computes log_probs at --rollout-temperature, replaying the rollout's top-p nucleus")
STATUS = {"completed": "stop", "truncated": "length", "aborted": "abort"}


#: slime versions whose Sample.to_dict() left spec_info as a Sample.SpecInfo object (pickle needed)
SPECINFO_VERSIONS = ("slime from f81ecfe (#640, 2025-10-31) until 5472cab (#855, 2025-11-21), whose "
                     "Sample.to_dict() kept spec_info as a Sample.SpecInfo object")


def pickled_classes(file: Path) -> list[str]:
    """The classes a ``torch.save`` zip file's pickle names, read with :mod:`pickletools` (which runs nothing).

    E.g. ``slime.utils.types.Sample.SpecInfo`` (a nested class pickled as
    ``getattr(Sample, "SpecInfo")`` at torch's pickle protocol 2); torch's own classes and plain
    containers are left out.

    Parameters
    ----------
    file : pathlib.Path
        A ``.pt`` file.

    Returns
    -------
    list of str
        The dotted class names, sorted; empty when the file is not a zip (an old ``torch.save``)
        or names none. A damaged pickle gives what was found before the damage.
    """
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(file) as zf:
            name = next((n for n in zf.namelist() if n.endswith("data.pkl")), None)
            data = zf.read(name) if name else b""
    except (zipfile.BadZipFile, OSError, KeyError):
        return []
    found: list[str] = []
    strings: list[str] = []
    getattr_next = False
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("GLOBAL", "STACK_GLOBAL"):
                what = arg.replace(" ", ".") if op.name == "GLOBAL" else ".".join(strings[-2:])
                if what in ("builtins.getattr", "__builtin__.getattr"):
                    getattr_next = True
                    continue
                if what.startswith(("torch.", "collections.OrderedDict", "_codecs.")):
                    continue
                found.append(what)
            elif isinstance(arg, str):
                strings.append(arg)
                if getattr_next and found:  # getattr(<the last global>, <this name>)
                    found[-1] = f"{found[-1]}.{arg}"
                    getattr_next = False
    except Exception:  # noqa: BLE001 - a damaged pickle: name what was found so far
        pass
    return sorted(set(found))


def load_weights_only(file: Path) -> Any:
    """``torch.load(file, weights_only=True)``, memory-mapped when the file allows it.

    Parameters
    ----------
    file : pathlib.Path
        A ``.pt`` file.

    Returns
    -------
    object
        The loaded containers and tensors (on CPU).

    Raises
    ------
    PickleRefusedError
        If the file needs full pickle, naming the classes it holds (slime's ``Sample.SpecInfo``
        gets a recipe to convert the file).
    ImportFormatError
        If torch is not installed (a ``.pt`` file is torch's format), torch cannot read the file, or
        a value is nested too deeply.
    """
    try:
        import torch
    except ImportError:
        raise ImportFormatError(f"{file}: a .pt file (torch.save) needs torch to be read, and torch is not "
                                "installed here: install it (pip install torch, or rlparity[cpu]) and import again")\
            from None

    def refuse(err: Exception) -> PickleRefusedError:
        classes = pickled_classes(file)
        if not classes:
            m = re.search(r"GLOBAL ([\w.]+)", str(err)) or re.search(r"global[^\w]+([\w.]+)", str(err))
            classes = [m.group(1)] if m else []
        what = f"{', '.join(classes)} object(s)" if classes else "Python objects"
        if any(c.endswith("Sample.SpecInfo") for c in classes):
            return PickleRefusedError(
                f"{file}: refused: it holds {what}, written by {SPECINFO_VERSIONS}; only full pickle (which runs code "
                "stored in the file) can rebuild them, and rlparity loads .pt files with torch.load(weights_only=True) "
                "only. If you trust the file, load it where that slime is installed and save spec_info as a dict: "
                "d = torch.load(f, weights_only=False); [s.update(spec_info=vars(s['spec_info'])) for s in "
                "d['samples']]; torch.save(d, f)")
        return PickleRefusedError(
            f"{file}: refused: it holds {what}, which only full pickle can rebuild, and unpickling runs code "
            "stored in the file. rlparity loads .pt files with torch.load(weights_only=True) only and never falls "
            "back to pickle. Save plain containers instead (dicts, lists, numbers, strings, tensors: slime's "
            "Sample.to_dict()), or write the generic format (rlparity/importers/GENERIC_FORMAT.md)")

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
        except RecursionError:
            raise ImportFormatError(f"{file}: a value nested too deeply to read: not a slime dump") from None
        except Exception as err:  # zip errors, EOF on a truncated file
            raise ImportFormatError(f"{file}: not a torch.save file torch can read ({type(err).__name__}: {err})") from None
    raise AssertionError("unreachable")


NAMES = {"rollout": "rollout_log_probs", "trainer": "log_probs", "entropy": "entropy"}
PROMPT_TOKENIZATION = {
    "add_special_tokens": False,
    "source": f"{SOURCE} slime/rollout/sglang_rollout.py: tokenizer.encode(sample.prompt, add_special_tokens=False) "
              "(the prompt already chat-templated); a list of messages goes through the chat template"}
REMOVED = ("remove_sample", "remove_sample: slime trains nothing of these samples (its train data zeroes their loss_mask)")


def _versions(value: Any, where: str) -> tuple[list[int] | None, str | None]:
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return None, None
    if not isinstance(value, (list, tuple)):
        raise ImportFormatError(f"{where}: field 'weight_versions' is {type(value).__name__}, not a list")
    try:
        versions = [as_int(int(v) if isinstance(v, str) else v, where, "weight_versions") for v in value]
    except (TypeError, ValueError, ImportFormatError):  # "v5", a list: not versions
        versions = [None]
    if None in versions:
        return None, "weight_versions are not numbers: policy_version not recorded"
    return versions, None


def _prompt(value: Any) -> tuple[str | None, str | None]:
    """``(prompt_text, prompt_messages)`` of a sample's ``prompt`` (a templated string or chat messages)."""
    if isinstance(value, str):
        return value or None, None
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        try:
            return None, json.dumps(value)
        except (TypeError, ValueError):  # images or tensors in the messages: not checkable as text
            return None, None
    return None, None


def _key(file: Path, data: dict, train: bool) -> ArmKey:
    """slime writes an eval dump with the same rollout_id as the training one, to the path template
    with ``eval_<rollout_id>`` in place of the id (observability/rollout_data_utils.py)."""
    rid = as_int(data.get("rollout_id"), str(file), "rollout_id")
    if rid is None:
        return ArmKey(label=safe_arm(file.stem), kind="train" if train else "")
    evaluation = re.search(rf"(?<![A-Za-z0-9])eval_0*{rid}(?!\d)", file.name) is not None
    label = f"rollout_eval_{rid}" if evaluation else f"rollout_{rid}"
    return ArmKey(label=label, step=rid, split="eval" if evaluation else "train", kind="train" if train else "")


def read_file(file: Path, ctx: ReadContext) -> Iterator[Record]:
    """Read one slime debug rollout or train data (``.pt``) file into records.

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
        the field); a file that needs full pickle raises ``PickleRefusedError``.
    """
    data = load_weights_only(file)
    if not isinstance(data, dict) or not isinstance(data.get("samples"), (list, tuple)):
        raise ImportFormatError(f"{file}: expected a slime debug dump, a dict with a 'samples' list "
                                f"(got {type(data).__name__}{' with keys ' + str(sorted(map(str, data))[:8]) if isinstance(data, dict) else ''})")
    train = data.get("format_version") is not None or any("log_probs" in s for s in data["samples"][:1] if isinstance(s, dict))
    key = _key(file, data, train)
    info = {"dump": "train" if train else "rollout", "format_version": data.get("format_version"),
            "rank": data.get("rank") if isinstance(data.get("rank"), int) else None}
    raw_rewards = data.get("raw_reward")
    if raw_rewards is not None and not isinstance(raw_rewards, (list, tuple)):
        raw_rewards = None
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
        n = len(ids)
        rlen_key = "response_lengths" if "response_lengths" in s else "response_length"
        rlen = as_int(need(s, rlen_key, where, what), where, rlen_key, lo=0, hi=n)
        p = n - rlen
        lm_key = "loss_masks" if "loss_masks" in s else "loss_mask"
        lm = s.get(lm_key)
        lm = np.ones(rlen, dtype=np.int64) if lm is None else ints(lm, where, lm_key, mask=True)
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
        excluded = {}
        if s.get("remove_sample") is True:
            excluded[REMOVED] = int(sampled.sum())
            sampled[:] = False
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
        note = None
        if train:
            finish = "length" if as_int(s.get("truncated"), where, "truncated", hi=1) else None
            pos = as_int(s.get("rollout_position"), where, "rollout_position")
            if raw_rewards is not None and pos is not None and pos < len(raw_rewards):
                reward = as_reward(raw_rewards[pos], where, f"raw_reward[{pos}]")
            else:
                reward, note = None, ("a train dump without raw_reward: its rewards are the normalised ones, not "
                                      "stored as the reward")
        else:
            finish = STATUS.get(str(s.get("status")))
            value = s.get("reward")
            reward = None if isinstance(value, dict) else as_reward(value, where)
            if isinstance(value, dict):
                note = "reward is a dict of several rewards (slime's --reward-key picks one): stored as NaN"
        # a GRPO group: the rollout dump's group_index, else (train dump) identical prompt ids
        group = as_int(s.get("group_index"), where, "group_index")
        sample_index = None
        if group is not None:
            sample_index = group_count.get(group, 0)
            group_count[group] = sample_index + 1
        versions, vnote = _versions(s.get("weight_versions"), where)
        text, messages = _prompt(s.get("prompt"))
        yield Record(
            key=key, where=where, ids=ids, sampled=sampled, rollout=rollout, trainer=trainer,
            turn_versions=versions, reward=reward, finish_reason=finish, prompt_index=group,
            sample_index=sample_index, prompt_text=text, prompt_messages=messages, excluded=excluded, names=NAMES,
            note=note or vnote, arm_info=info)
        step = (size * (i + 1)) // len(samples) - done
        done += step
        ctx.advance(step)


def find_files(path: Path) -> list[Path]:
    """The dump files under ``path`` (the format's ``find_files``).

    Parameters
    ----------
    path : pathlib.Path
        A file (returned as is) or a folder.

    Returns
    -------
    list of pathlib.Path
        The ``.pt`` files under it, in natural order (``step_2`` before ``step_10``).
    """
    if path.is_file():
        return [path]
    return sorted((p for p in path.rglob("*.pt") if p.is_file()), key=natural_key)


FORMAT = Format(
    name="slime", description="slime debug rollout/train data, .pt (torch.load weights_only; rollout side, "
                              "the train dump adds the trainer's log_probs)",
    find_files=find_files, read_file=read_file, trainer=TRAINER, prompt_tokenization=PROMPT_TOKENIZATION)
