"""Read a peer's per-step dumps of a whole run into an rlparity run store, step by step, through
the run recorder (:class:`rlparity.record.Recorder`: the store, metrics and alarms a live run
gets; ``rlparity doctor RUN`` reads it).

Each step is parsed by the importer of its format (:mod:`rlparity.importers`, one step at a time:
memory holds one step), turned into a :class:`~rlparity.record.StepRecord`
(:meth:`~rlparity.record.StepRecord.from_trace`) and recorded in step order.

* ``prime-rl``: ``<output_dir>/token_exports/step_N/rank_R.jsonl`` (the trainer's token export,
  ``trainer.enable_token_export``), the rank files of a step together. pi_old is
  ``trainer_logprobs``. Left missing: the policy version of each
  token and the version that scored it (prime-rl is asynchronous, up to ``max_async_level`` steps
  behind, and the export records neither), the engine's weight digests, rewards, advantages, finish reasons,
  and the temperature and top-k unless given (the export records none).
* ``verl``: a folder of ``step_N.npz`` files written by ``GENERIC_FORMAT.md``'s "From verl"
  recipe in ``RayPPOTrainer.fit`` (verl's batch: ``input_ids``, ``attention_mask``,
  ``response_mask``, ``rollout_log_probs``, ``old_log_probs``); where verl's own
  ``trainer.rollout_data_dir`` dump ``N.jsonl`` lies beside ``step_N.npz`` (the same folder), its
  ``score`` column gives the rewards. Versions: the step (``RayPPOTrainer.fit`` is synchronous).
  Left missing: the engine's weight digests, advantages, finish reasons. verl's ``N.jsonl`` alone
  (text and score) holds nothing to compare: refused with what works
  (:func:`rlparity.record.verl.record_verl`, or the recipe).

What the dump lacks is listed in the store's ``attrs["peer"]["missing"]`` and stored as missing
(versions -1, rewards NaN, no digest), never filled in.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlparity.importers.values import natural_key
from rlparity.record import Recorder, RecorderSettings, StepRecord
from rlparity.trace import arm_record

FORMATS = ("prime-rl", "verl")
PRIME_SOURCE = "PrimeIntellect-ai/prime-rl src/prime_rl/trainer/rl/token_export.py @ 559b447 (TokenExporter)"
VERL_SOURCE = ("volcengine/verl verl/trainer/ppo/ray_trainer.py @ b178a3c (_dump_generations) and "
               "rlparity/importers/GENERIC_FORMAT.md 'From verl'")
MISSING = {
    "prime-rl": {
        "policy_version": "the export records no version per token (prime-rl samples up to max_async_level steps "
                          "behind the trainer)",
        "scored_version": "the export records which trainer step computed trainer_logprobs, not which weights "
                          "generated the tokens",
        "weight_digest": "prime-rl's weight broadcast reports no checksums",
        "reward": "the export holds advantages, not rewards",
        "advantage": "the export's per-token advantages are not read (rlparity.importers' prime-rl reader keeps none)",
        "finish_reason": "the export keeps no finish reason",
    },
    "verl": {
        "weight_digest": "verl's weight sync reports no checksums",
        "advantage": "the recipe's .npz holds no advantages",
        "finish_reason": "verl's batch keeps no finish reason",
    },
}


class RunImportError(ValueError):
    """The dump cannot become a run store (the message names the file and what to do)."""


@dataclass
class RunImport:
    """What :func:`import_run` wrote.

    Parameters
    ----------
    path : Path
        The run store.
    steps : list of int
        The peer's step numbers, in the store's order.
    alarms : dict
        ``{step: [alarm codes]}`` of the steps that raised any.
    missing : dict
        ``{field: why}``: what the dump lacks, stored as missing.
    """

    path: Path
    steps: list[int] = field(default_factory=list)
    alarms: dict[int, list[str]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        fired = ", ".join(f"step {k}: {' '.join(v)}" for k, v in self.alarms.items()) or "none"
        return (f"{self.path}: {len(self.steps)} steps ({self.steps[0]}..{self.steps[-1]}); alarms: {fired}; "
                f"missing from the dump: {', '.join(self.missing) or 'nothing'}")


def prime_rl_steps(path: Path) -> list[tuple[int, Path]]:
    """The ``step_N`` folders of a prime-rl token export, in step order.

    Parameters
    ----------
    path : Path
        The trainer's ``output_dir`` (holding ``token_exports``), ``token_exports`` itself, or
        one run's folder of the multi-run layout.

    Returns
    -------
    list of (int, Path)

    Raises
    ------
    RunImportError
        No ``step_N`` folder is there.
    """
    root = path / "token_exports" if (path / "token_exports").is_dir() else path
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if p.is_dir()
                   for m in [re.fullmatch(r"step_(\d+)", p.name)] if m)
    if not steps:
        raise RunImportError(f"{path} holds no token_exports/step_N folder: give prime-rl's output_dir (run with "
                             "trainer.enable_token_export=true)")
    return steps


def verl_steps(path: Path) -> list[tuple[int, Path]]:
    """The per-step ``.npz`` files of verl's batch (the "From verl" recipe), in step order.

    Parameters
    ----------
    path : Path
        The folder (verl's ``rollout_data_dir`` or the recipe's).

    Returns
    -------
    list of (int, Path)

    Raises
    ------
    RunImportError
        No ``.npz`` is there (verl's text dump alone is named as such).
    """
    files = sorted(path.glob("*.npz"), key=natural_key)
    if not files:
        text = sorted(path.glob("*.jsonl"))
        what = (f"only verl's rollout_data_dir text dump ({text[0].name}...: decoded text and score, no token ids or "
                "logprobs)" if text else "no .npz file")
        raise RunImportError(f"{path} holds {what}: record the run with rlparity.record.verl.record_verl, or save "
                             "verl's batch per step as 'From verl' in rlparity/importers/GENERIC_FORMAT.md shows")
    out = []
    for f in files:
        m = re.search(r"(\d+)$", f.stem)
        if m is None:
            raise RunImportError(f"{f}: no step number in the name: name the files step_N.npz as the recipe does")
        out.append((int(m.group(1)), f))
    return sorted(out)


def verl_scores(npz: Path, step: int, n: int) -> np.ndarray | None:
    """The ``score`` column of verl's own ``{step}.jsonl`` beside ``npz`` (one line per sequence, in
    the batch's order); ``None`` without that file.

    Parameters
    ----------
    npz : pathlib.Path
        The step's ``.npz`` (the recipe's file); verl's ``{step}.jsonl`` is looked for beside it.
    step : int
        The step, which names verl's file.
    n : int
        The batch's sequences: the file must have as many lines.

    Returns
    -------
    numpy.ndarray or None
        One float score per sequence, or ``None`` when verl's file is absent.

    Raises
    ------
    RunImportError
        The file's line count differs from the batch's sequences, or a score is no number.
    """
    f = npz.parent / f"{step}.jsonl"
    if not f.exists():
        return None
    with open(f, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    if len(rows) != n:
        raise RunImportError(f"{f}: {len(rows)} lines for the {n} sequences of {npz.name}: both must come from one "
                             "batch (move the file away to import without rewards)")
    try:
        return np.array([float(r["score"]) for r in rows])
    except (KeyError, TypeError, ValueError) as err:
        raise RunImportError(f"{f}: a line without a numeric 'score' ({err}): is this verl's _dump_generations "
                             "output?") from None


def _traces(format: str, units: list[tuple[int, Path]], options: dict[str, Any]
            ) -> Iterator[tuple[int, Path, Any]]:
    import rlparity.importers as rio
    from rlparity.importers import ImportFormatError

    reader = "prime-rl" if format == "prime-rl" else "generic"
    for step, unit in units:
        try:
            arms = rio.read(reader, unit, **options)
        except ImportFormatError as err:
            raise RunImportError(str(err)) from None
        if len(arms) != 1:
            raise RunImportError(f"{unit} holds {len(arms)} arms ({', '.join(arms)}), one step expected: give one run's "
                                 "folder (the multi-run layout keeps a token_exports per run)")
        yield step, unit, next(iter(arms.values()))


def _record(format: str, step: int, trace: Any, side: str, unit: Path) -> StepRecord:
    """The step's record from its imported trace, what the dump lacks left missing."""
    info = arm_record(trace).import_ or {}
    fields: dict[str, Any] = {"step": step}
    if format == "prime-rl":
        # the trainer step that exported (prime-rl's own counter) is the trainer's version
        trainer_step = info.get("trainer_step")
        fields["trainer_version"] = int(step if trainer_step is None else trainer_step)
        fields["policy_versions"] = -1  # unknown: stored as missing
        fields["scored_version"] = -1
    else:  # RayPPOTrainer.fit: generate, compute pi_old, update, on the step's weights
        fields.update(trainer_version=step, policy_versions=step, scored_version=step)
        n = int(trace.sizes["sequence"])
        scores = verl_scores(unit, step, n)
        if scores is not None:
            fields["rewards"] = scores
    fields["weight_version"] = None
    fields["weight_digest"] = None
    return StepRecord.from_trace(trace, trainer=side, **fields)


def import_run(format: str, path: str | os.PathLike, out: str | os.PathLike, *, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, overwrite: bool = False,
               settings: RecorderSettings | None = None) -> RunImport:
    """Read a peer's per-step dumps into a run store (:class:`rlparity.record.Recorder`'s), one step at a time.

    Parameters
    ----------
    format : {"prime-rl", "verl"}
        The peer.
    path : str or os.PathLike
        prime-rl's ``output_dir`` (``token_exports/step_N``), or the folder of verl's per-step ``.npz``.
    out : str or os.PathLike
        The run store to write.
    temperature, top_k, top_p : optional
        The run's sampling where the dump does not record it (prime-rl records none of them).
    overwrite : bool, default False
        Replace a run store at ``out``.
    settings : RecorderSettings, optional
        Recorder settings (its ``trainer_side`` is the importer's reading of the peer's trainer).

    Returns
    -------
    RunImport
        The store, the steps, the alarms per step and what the dump lacks.

    Raises
    ------
    RunImportError
        Unknown format, nothing to import, a malformed dump (its file and line), or a step without
        the trainer's logprobs.
    FileNotFoundError
        ``path`` does not exist.
    """
    if format not in FORMATS:
        raise RunImportError(f"unknown format {format!r}: choose one of {', '.join(FORMATS)}")
    src = Path(path)
    if not src.exists():
        raise FileNotFoundError(f"{path} does not exist: give the folder of the run's per-step dumps")
    if not src.is_dir():
        raise RunImportError(f"{path} is a file: give the folder of the run's per-step dumps")
    units = prime_rl_steps(src) if format == "prime-rl" else verl_steps(src)
    options = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    result = RunImport(Path(out), missing=dict(MISSING[format]))
    rec: Recorder | None = None
    try:
        for step, unit, trace in _traces(format, units, options):
            tr = arm_record(trace).scorer.to_attrs()
            side = tr.get("reading")
            if side not in ("processed", "raw"):
                raise RunImportError(f"step {step} of {src} has no trainer logprobs (pi_old): the run store compares "
                                     "the engine's with the trainer's (verl: save old_log_probs)")
            if rec is None:
                for name in arm_record(trace).sampling_unknown or []:
                    result.missing[name] = f"the dump does not record it: pass --{name.replace('_', '-')}"
                peer = {"framework": format, "source": PRIME_SOURCE if format == "prime-rl" else VERL_SOURCE,
                        "path": str(src), "missing": result.missing, "trainer": tr}
                base = settings or RecorderSettings()
                rec = Recorder(out, base, overwrite=overwrite, trainer_side=side, background=False,
                               sampling={k: v for k, v in options.items() if v is not None},
                               attrs={**dict(base.attrs or {}), "peer": peer})
            elif side != rec.trainer_side:
                raise RunImportError(f"step {step} of {src}: the trainer's logprobs read {side}, earlier steps "
                                     f"{rec.trainer_side}: one run store holds one reading (pass top_k/top_p)")
            metrics = rec.step(_record(format, step, trace, side, unit))
            result.steps.append(step)
            if metrics.alarms:
                result.alarms[step] = [a.code for a in metrics.alarms]
    finally:
        if rec is not None:
            rec.close()
    return result


__all__ = ["FORMATS", "MISSING", "RunImport", "RunImportError", "import_run", "prime_rl_steps", "verl_scores",
           "verl_steps"]
