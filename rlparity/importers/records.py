"""A dump's records: :class:`Record` (one sample: its token ids, which the engine sampled, the per-token
arrays aligned with them), its :class:`ArmKey`, the checks of its values (:func:`check_values`) and
:func:`split_record`, which cuts it into engine-sampled sequences (one per assistant turn)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlparity.importers.errors import ImportFormatError
from rlparity.importers.values import safe_arm, same_length
from rlparity.trace.schema import POSITIVE_TOLERANCE


@dataclass(frozen=True)
class ArmKey:
    """What makes an arm: one arm per (run, launch, split, step) of a dump, plus a format's own distinction.

    These are stored as the arm's coordinates (``attrs["import"]["coords"]``); the arm name is only
    a label built from them.

    Parameters
    ----------
    label : str
        How the format names the step (``step_3``, ``rollout_2``; a file name when the dump has no step).
    step : int, optional
        The dump's step; ``None``: the dump has none.
    run : str, optional
        The run's name, where the dump has several.
    split : str, default "train"
        The split (``train``, ``validation``...).
    kind : str, default ""
        A format's own distinction (slime's rollout vs train dump).
    launch : str, default ""
        Filled by the reader from the folder a file came from.
    """

    label: str
    step: int | None = None
    run: str | None = None
    split: str = "train"
    kind: str = ""
    launch: str = ""

    def name(self) -> str:
        """The arm's name: launch, run, label and kind joined by ``_`` (a run named like its launch folder said once).

        Returns
        -------
        str
            A name usable as a zarr group (:func:`~rlparity.importers.values.safe_arm`).
        """
        launch = "" if self.launch == "." else self.launch
        # prime-rl's multi-run layout puts a run in a folder named after it: say it once
        run = None if self.run and Path(launch).name == self.run else self.run
        return safe_arm("_".join(p for p in (launch, run, self.label, self.kind) if p))

    def coords(self) -> dict[str, Any]:
        """The arm's coordinates, as stored in ``attrs["import"]["coords"]``.

        Returns
        -------
        dict
            ``run``, ``launch``, ``split``, ``step`` and, when set, ``kind``.
        """
        return {"run": self.run, "launch": self.launch, "split": self.split, "step": self.step,
                **({"kind": self.kind} if self.kind else {})}


#: what a record's per-token arrays are called in the dump (for messages)
FIELD_NAMES = {"rollout": "rollout logprob", "trainer": "trainer logprob", "entropy": "trainer entropy"}


@dataclass
class Record:
    """One sample of a dump, before it is cut into engine-sampled sequences.

    Parameters
    ----------
    key : ArmKey
        The arm the sample belongs to.
    where : str
        The file and line (or sample), for messages.
    ids : numpy.ndarray
        Token ids: the prompt and every later token.
    sampled : numpy.ndarray
        Aligned with ``ids``: marks the tokens the engine sampled and the framework trains with RL.
    rollout : numpy.ndarray
        Aligned with ``ids``: the engine's logprob (nats) at sampled tokens (NaN = the dump's null).
    trainer : numpy.ndarray, optional
        Aligned with ``ids``: the framework's trainer logprob (nats; ``-inf`` = probability 0).
    entropy : numpy.ndarray, optional
        Aligned with ``ids``: the trainer's entropy (nats).
    version : int or numpy.ndarray, optional
        One policy version for the sample, one per token, or ``None`` (not recorded).
    turn_versions : list of int, optional
        One policy version per assistant turn.
    reward : float, optional
        The sample's reward; ``None``: not scored.
    finish_reason : str, optional
        Why sampling stopped; ``None``: not recorded.
    sampling : dict, optional
        The sampling parameters the dump records for the sample.
    prompt_index : int or str, optional
        The prompt's index (an int) or a group name the dump gives; ``None``: grouped by
        identical prompt ids.
    sample_index : int, optional
        The sample's index within its prompt; ``None``: numbered in order of appearance.
    prompt_text : str, optional
        The prompt's text, when the dump has it.
    prompt_messages : str, optional
        The prompt's chat messages as JSON, when the dump has them.
    excluded : dict, optional
        Tokens the framework marks as not RL-sampled (a loss or sample mask), counted per
        ``(code, reason)``: they are left out of ``sampled``.
    names : Mapping of str to str, optional
        Maps ``rollout`` / ``trainer`` / ``entropy`` to the dump's field names (for messages).
    note : str, optional
        Something about this record that the arm's notes list once (with a count).
    arm_info : dict, optional
        Per-arm facts (ranks, dump versions) whose distinct values the arm's attrs list.
    """

    key: ArmKey
    where: str
    ids: np.ndarray
    sampled: np.ndarray
    rollout: np.ndarray
    trainer: np.ndarray | None = None
    entropy: np.ndarray | None = None
    version: int | np.ndarray | None = None
    turn_versions: list[int] | None = None
    reward: float | None = None
    finish_reason: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    prompt_index: int | str | None = None
    sample_index: int | None = None
    prompt_text: str | None = None
    prompt_messages: str | None = None
    excluded: dict[tuple[str, str], int] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=lambda: FIELD_NAMES)
    note: str | None = None
    arm_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class SampledSequence:
    """One engine-sampled sequence cut from a :class:`Record` (:func:`split_record`).

    Parameters
    ----------
    prompt : numpy.ndarray
        Every token before the response.
    response : numpy.ndarray
        The sampled tokens.
    rollout : numpy.ndarray
        The engine's logprob of each response token, nats.
    trainer : numpy.ndarray or None
        The framework's trainer logprob of each response token, nats.
    entropy : numpy.ndarray or None
        The trainer's entropy at each response token, nats.
    versions : numpy.ndarray or None
        The policy version of each response token; ``None``: not recorded.
    """
    prompt: np.ndarray
    response: np.ndarray
    rollout: np.ndarray
    trainer: np.ndarray | None
    entropy: np.ndarray | None
    versions: np.ndarray | None


def _refuse_values(rec: Record, name: str, bad: np.ndarray, what: str, fix: str) -> None:
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    k = int(np.count_nonzero(rec.sampled[: i + 1]))
    raise ImportFormatError(f"{rec.where}: {rec.names.get(name, name)} is {what} at token {i} (id {int(rec.ids[i])}, "
                            f"sampled token {k} of the sample; {int(bad.sum())} such token(s)): {fix}")


_NOT_LOGPROB = "store the log-softmax of the sampled token in nats (<= 0)"
_NO_TRAINER = "import without the trainer side (trainer_reading='none') and `rlparity score` it"


def check_values(rec: Record) -> int:
    """Refuse what a sampled token cannot carry, naming the record's file and line.

    Refused: a rollout logprob that is null/NaN, infinite or positive; a trainer logprob that is
    NaN, +inf or positive; a non-finite trainer entropy.

    Parameters
    ----------
    rec : Record
        The record.

    Returns
    -------
    int
        The number of sampled tokens whose trainer logprob is ``-inf`` (probability 0: legal, counted).

    Raises
    ------
    ImportFormatError
        At the first refused value (its token, id and how many such tokens).
    """
    s = rec.sampled.astype(bool)
    r, t, e = rec.rollout, rec.trainer, rec.entropy
    with np.errstate(invalid="ignore"):
        checks = [
            ("rollout", np.isnan(r), "null/NaN", "the engine returned no finite logprob there; drop this sample from "
                                                 "the dump or fix the engine output"),
            ("rollout", np.isinf(r), "infinite", "an engine cannot give probability 0 (or > 1) to a token it sampled "
                                                 "itself: check its logprobs_mode and what the dump stores there"),
            ("rollout", r > POSITIVE_TOLERANCE, "positive (not a log-probability)", _NOT_LOGPROB)]
        if t is not None:
            checks += [("trainer", np.isnan(t), "NaN", "a missing value (null or NaN), not a token of probability 0 (write "
                        f"-Infinity for that): the trainer's forward pass produced NaN there or the dump left it out; "
                        f"re-run the trainer step or {_NO_TRAINER}"),
                       ("trainer", t > POSITIVE_TOLERANCE, "positive or +inf (not a log-probability)", _NOT_LOGPROB)]
        if e is not None:
            checks.append(("entropy", ~np.isfinite(e), "null/non-finite",
                           f"the trainer's forward pass produced no finite entropy there; {_NO_TRAINER}"))
        for name, bad, what, fix in checks:
            _refuse_values(rec, name, s & bad, what, fix)
        return 0 if t is None else int((s & (t == -np.inf)).sum())


def split_record(rec: Record) -> list[SampledSequence]:
    """Cut a record into engine-sampled sequences.

    Each maximal run of sampled tokens is one response whose prompt is every token before it (a
    multi-turn sample gives one sequence per assistant turn; tool/user tokens in between become
    part of the next turn's prompt).

    Parameters
    ----------
    rec : Record
        The record.

    Returns
    -------
    list of SampledSequence
        One per run of sampled tokens, in order (empty when nothing was sampled).

    Raises
    ------
    ImportFormatError
        If the per-token arrays are not aligned with the ids, or an id is negative (padding).
    """
    ids, sampled = rec.ids, rec.sampled.astype(bool)
    n = len(ids)
    same_length(rec.where, n, sampled=sampled, rollout=rec.rollout, trainer=rec.trainer, entropy=rec.entropy)
    version = rec.version
    if isinstance(version, np.ndarray):
        same_length(rec.where, n, policy_version=version)
    if np.any(ids < 0):
        raise ImportFormatError(f"{rec.where}: negative token id {int(ids[ids < 0][0])}: padding must be removed "
                                "(or marked by attention_mask in .npz files)")
    edges = np.diff(np.concatenate([[0], sampled.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    turn_versions = rec.turn_versions if rec.turn_versions and len(rec.turn_versions) == len(starts) else None
    out = []
    for j, (s, e) in enumerate(zip(starts, ends)):
        if isinstance(version, np.ndarray):
            v = version[s:e]
        elif turn_versions is not None:
            v = np.full(e - s, int(turn_versions[j]), dtype=np.int64)
        elif version is not None:
            v = np.full(e - s, int(version), dtype=np.int64)
        else:
            v = None
        out.append(SampledSequence(
            prompt=ids[:s], response=ids[s:e], rollout=rec.rollout[s:e],
            trainer=None if rec.trainer is None else rec.trainer[s:e],
            entropy=None if rec.entropy is None else rec.entropy[s:e], versions=v))
    return out
