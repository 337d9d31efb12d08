"""The chunked build of ordinary traces: :class:`ArmBuilder` collects the sequences of one arm into
traces of ``chunk_size`` sequences through :func:`rlparity.trace.from_rollouts` and
:func:`rlparity.trace.with_trainer`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from rlparity.importers.errors import ImportFormatError
from rlparity.importers.reading import READING_VARIABLES, TrainerSpec
from rlparity.importers.records import ArmKey, Record, SampledSequence, check_values, split_record
from rlparity.importers.sampling import SAMPLING_FIELDS, SamplingResolver
from rlparity.trace import from_rollouts, pad_rows, validate, with_trainer


def _distinct(info: dict[str, list], new: Mapping[str, Any]) -> None:
    """Collect the distinct values of each per-arm fact (ranks, dump versions) in order."""
    for k, v in new.items():
        seen = info.setdefault(k, [])
        if v not in seen:
            seen.append(v)


@dataclass
class ArmBuilder:
    """Collects the sequences of one arm and turns them into traces, ``chunk_size`` sequences at a time.

    It also counts what the final attrs report. Only the first eight fields are given; the rest
    is its running state.

    Parameters
    ----------
    arm : str
        The arm's name.
    key : ArmKey
        The arm's coordinates.
    fmt : str
        The format's name.
    trainer_spec : TrainerSpec or None
        How the framework's trainer computes its logprobs; ``None``: the dump has none.
    reading : str
        Where the trainer logprobs go (:func:`~rlparity.importers.reading.decide_reading`).
    sampling : SamplingResolver
        Resolves each record's sampling parameters.
    chunk_size : int
        Sequences per trace chunk.
    prompt_tokenization : dict, optional
        How the framework tokenizes prompt texts (recorded when texts are kept).
    rows : dict of str to list, optional
        The buffered per-sequence values of the chunk being built.
    info : dict of str to list, optional
        Per-arm facts and their distinct values.
    groups : dict, optional
        Prompt group -> ``[prompt_index, samples so far]``.
    has_trainer : bool, optional
        Whether the arm carries trainer logprobs (set by the first record).
    has_entropy : bool, optional
        Whether the arm carries trainer entropies (set by the first record).
    n_records : int, default 0
        Records added.
    n_sequences : int, default 0
        Sequences built.
    n_tokens : int, default 0
        Response tokens built.
    n_multi_turn_records : int, default 0
        Records that gave more than one sequence.
    n_records_without_sampled_tokens : int, default 0
        Records that gave none.
    n_trainer_zero_prob_tokens : int, default 0
        Sampled tokens with trainer logprob ``-inf``.
    n_not_renormalized : int, default 0
        Sequences sampled with a top-k/top-p cut the framework's trainer does not apply.
    n_trainer_copies : int, default 0
        Sequences whose trainer logprobs equal the rollout's bit for bit.
    n_prompt_texts : int, default 0
        Records with a prompt text or messages.
    excluded : dict, optional
        Per exclusion code: tokens, records, records left empty, reason.
    record_notes : dict of str to int, optional
        Record notes and their counts.
    dropped_trainer : bool, default False
        Whether trainer logprobs were dropped (``trainer_reading='none'``).
    unknown : set, optional
        Sampling fields unknown for some sequence.
    from_framework : set, optional
        Sampling fields taken from the framework's default.
    version_missing : bool, default False
        Whether some record has no policy version.
    reward_missing : bool, default False
        Whether some record has no reward.
    finish_missing : bool, default False
        Whether some record has no finish reason.
    grouped_by_prompt : bool, default False
        Whether prompts were grouped by identical prompt ids.
    files : list, optional
        The files the arm was read from.
    first_where : str, default ""
        Where the arm's first record came from (for messages).
    """

    arm: str
    key: ArmKey
    fmt: str
    trainer_spec: TrainerSpec | None
    reading: str
    sampling: SamplingResolver
    chunk_size: int
    prompt_tokenization: dict[str, Any] | None = None
    rows: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "prompt", "response", "rollout", "trainer", "entropy", "versions", "reward", "finish", "temperature",
        "top_k", "top_p", "prompt_index", "sample_index", "prompt_text", "prompt_messages")})
    info: dict[str, list] = field(default_factory=dict)  # fact -> its distinct values
    groups: dict[Any, list[int]] = field(default_factory=dict)  # group -> [prompt_index, samples so far]
    has_trainer: bool | None = None
    has_entropy: bool | None = None
    n_records: int = 0
    n_sequences: int = 0
    n_tokens: int = 0
    n_multi_turn_records: int = 0
    n_records_without_sampled_tokens: int = 0
    n_trainer_zero_prob_tokens: int = 0
    n_not_renormalized: int = 0
    n_trainer_copies: int = 0
    n_prompt_texts: int = 0
    excluded: dict[str, dict[str, Any]] = field(default_factory=dict)  # code -> counts and reason
    record_notes: dict[str, int] = field(default_factory=dict)
    dropped_trainer: bool = False
    unknown: set = field(default_factory=set)
    from_framework: set = field(default_factory=set)
    version_missing: bool = False
    reward_missing: bool = False
    finish_missing: bool = False
    grouped_by_prompt: bool = False
    files: list = field(default_factory=list)
    first_where: str = ""

    def _group(self, rec: Record, seqs: list[SampledSequence]) -> tuple[int, int]:
        """``(prompt_index, sample_index)``: the record's own index; else its group (a name the
        dump gives, or identical prompt ids: the tokens before its first sampled token) numbered
        in order of appearance."""
        if isinstance(rec.prompt_index, int):
            return rec.prompt_index, (rec.sample_index if rec.sample_index is not None else 0)
        if rec.prompt_index is None:
            self.grouped_by_prompt = True
            key: Any = np.ascontiguousarray(seqs[0].prompt, dtype=np.int64).tobytes()
        else:
            key = rec.prompt_index
        g = self.groups.setdefault(key, [len(self.groups), 0])
        g[1] += 1
        return g[0], (rec.sample_index if rec.sample_index is not None else g[1] - 1)

    def _count_excluded(self, rec: Record, kept_any: bool) -> None:
        for (code, reason), n in rec.excluded.items():
            if n:
                e = self.excluded.setdefault(code, {"tokens": 0, "records": 0, "records_left_empty": 0,
                                                    "reason": reason})
                e["tokens"] += int(n)
                e["records"] += 1
                e["records_left_empty"] += int(not kept_any)

    def add(self, rec: Record) -> list[xr.Dataset]:
        """Add one record; return the chunks that became full.

        Parameters
        ----------
        rec : Record
            The record (its trainer and entropy arrays may be dropped in place to match the arm).

        Returns
        -------
        list of xarray.Dataset
            The full chunk (at most one), or nothing.

        Raises
        ------
        ImportFormatError
            If the record's values are refused (:func:`~rlparity.importers.records.check_values`), its sampling contradicts an
            option, or it carries trainer logprobs (or entropies) where the arm's first record did
            not, or the other way round.
        """
        self.n_records += 1
        if not self.first_where:
            self.first_where = rec.where
        _distinct(self.info, rec.arm_info)
        if rec.note:
            self.record_notes[rec.note] = self.record_notes.get(rec.note, 0) + 1
        values, unknown, from_fw = self.sampling.resolve(rec.sampling, rec.where)
        self.unknown |= unknown
        self.from_framework |= from_fw
        has_trainer = rec.trainer is not None and self.reading != "none"
        self.dropped_trainer |= rec.trainer is not None and self.reading == "none"
        if self.has_trainer is None:
            self.has_trainer = has_trainer
            self.has_entropy = has_trainer and rec.entropy is not None
        elif has_trainer != self.has_trainer:
            raise ImportFormatError(
                f"{rec.where}: this record {'has' if has_trainer else 'lacks'} trainer logprobs but the first "
                f"record of arm {self.arm!r} ({self.first_where}) {'does not' if has_trainer else 'does'}: a dump "
                "must carry them for every sample or for none")
        if not has_trainer:
            rec.trainer = rec.entropy = None
        elif not self.has_entropy:
            rec.entropy = None
        elif rec.entropy is None:
            raise ImportFormatError(f"{rec.where}: this record has no {rec.names.get('entropy', 'entropy')} but the "
                                    f"first record of arm {self.arm!r} ({self.first_where}) does: a dump must carry it "
                                    "for every sample or for none")
        zero_prob = check_values(rec)
        seqs = split_record(rec)
        self._count_excluded(rec, bool(seqs))
        if not seqs:
            self.n_records_without_sampled_tokens += 1
            return []
        self.n_trainer_zero_prob_tokens += zero_prob
        if len(seqs) > 1:
            self.n_multi_turn_records += 1
        if rec.version is None and rec.turn_versions is None:
            self.version_missing = True
        if rec.reward is None:
            self.reward_missing = True
        if rec.finish_reason is None:
            self.finish_missing = True
        if self.trainer_spec is not None and self.has_trainer:
            cut_k = values["top_k"] > 0 and "top_k" not in self.trainer_spec.applies
            cut_p = values["top_p"] < 1.0 and "top_p" not in self.trainer_spec.applies
            if cut_k or cut_p:
                self.n_not_renormalized += len(seqs)
        prompt_index, sample_index = self._group(rec, seqs)
        self.n_prompt_texts += bool(rec.prompt_text or rec.prompt_messages)
        r = self.rows
        for j, s in enumerate(seqs):
            r["prompt"].append(s.prompt)
            r["response"].append(s.response)
            r["rollout"].append(s.rollout)
            if self.has_trainer:
                self.n_trainer_copies += bool(np.array_equal(s.trainer, s.rollout))
                r["trainer"].append(s.trainer)
                if self.has_entropy:
                    r["entropy"].append(s.entropy)
            r["versions"].append(s.versions)
            r["reward"].append(np.nan if rec.reward is None else float(rec.reward))
            # an earlier turn's own stop reason is not in the dumps
            r["finish"].append(rec.finish_reason if (rec.finish_reason and j == len(seqs) - 1) else "unknown")
            for name in SAMPLING_FIELDS:
                r[name].append(values[name])
            r["prompt_index"].append(prompt_index)
            r["sample_index"].append(sample_index)
            # the prompt text is the first turn's prompt; a later turn's prompt holds earlier turns too
            r["prompt_text"].append((rec.prompt_text or "") if j == 0 else "")
            r["prompt_messages"].append((rec.prompt_messages or "") if j == 0 else "")
            self.n_sequences += 1
            self.n_tokens += len(s.response)
        if len(r["response"]) >= self.chunk_size:
            return [self.flush()]
        return []

    def flush(self) -> xr.Dataset | None:
        """The buffered sequences as one trace, then clear the buffer.

        Returns
        -------
        xarray.Dataset or None
            A validated trace (:func:`rlparity.trace.from_rollouts`, plus the trainer side via
            :func:`rlparity.trace.with_trainer`); ``None`` when nothing is buffered.

        Raises
        ------
        ImportFormatError
            If the trace fails validation.
        """
        r = self.rows
        if not r["response"]:
            return None
        versions = None
        if any(v is not None for v in r["versions"]):
            versions = [v if v is not None else np.zeros(len(t), dtype=np.int64)
                        for v, t in zip(r["versions"], r["response"])]
        ds = from_rollouts(
            prompt_token_ids=r["prompt"], token_ids=r["response"], rollout_logprobs=r["rollout"],
            finish_reasons=r["finish"], policy_versions=versions, prompt_index=r["prompt_index"],
            sample_index=r["sample_index"], temperature=r["temperature"], top_k=r["top_k"], top_p=r["top_p"],
            rewards=r["reward"], prompt_texts=r["prompt_text"], prompt_messages=r["prompt_messages"],
            attrs={"arm": self.arm, "capture_backend": f"import:{self.fmt}"})
        if self.has_trainer:
            width = ds.sizes["position"]
            arrays = {}
            readings = ["processed", "raw"] if self.reading == "both" else [self.reading]
            for reading in readings:
                lp_var, ent_var = READING_VARIABLES[reading]
                arrays[lp_var] = pad_rows(r["trainer"], np.nan, np.float64, width=width)
                if self.has_entropy:
                    arrays[ent_var] = pad_rows(r["entropy"], np.nan, np.float64, width=width)
            ds = with_trainer(ds, arrays)
        for k in r:
            r[k] = []
        try:
            return validate(ds, where=f"arm {self.arm!r} (from {self.first_where})")
        except ValueError as err:
            raise ImportFormatError(str(err)) from None

    # ------------------------------------------------------------------ final attrs

    def trainer_attrs(self) -> dict[str, Any] | None:
        """The ``attrs["trainer"]`` of the arm: the reading, what the framework's trainer applies and the notes.

        Returns
        -------
        dict or None
            ``source``, ``field``, ``reading``, ``applies``, ``decided_from``,
            ``not_renormalized_sequences``, ``copied_from_rollout_sequences``,
            ``zero_probability_tokens`` and ``note``; ``None`` when the arm has no trainer side.
        """
        if not self.has_trainer or self.trainer_spec is None:
            return None
        spec = self.trainer_spec
        reading = {"both": "processed+raw"}.get(self.reading, self.reading)
        notes = [spec.note] if spec.note else []
        if self.reading == "both":
            notes.append("temperature 1 and no top-k/top-p for the whole file: the raw and processed readings "
                         "coincide, so both variables hold the framework's values")
        if self.n_not_renormalized:
            cut = sorted({"top_k", "top_p"} - set(spec.applies))
            notes.append(f"{self.n_not_renormalized} sequence(s) were sampled with {'/'.join(cut)} cutting the "
                         f"distribution, which this framework's trainer does not apply: there its logprobs are "
                         "tempered but not renormalised over the kept set (neither reading exactly; d includes "
                         "the trainer's missing -log kept mass). `rlparity score --model` computes both exact readings")
        if self.n_trainer_copies:
            notes.append(f"on {self.n_trainer_copies} of {self.n_sequences} sequence(s) the trainer logprobs equal "
                         "the rollout's bit for bit: a copy, not a recomputation (verl's bypass mode sets "
                         "old_log_probs = rollout_log_probs); nothing to compare there")
        if self.n_trainer_zero_prob_tokens:
            notes.append(f"{self.n_trainer_zero_prob_tokens} sampled token(s) have trainer logprob -inf (probability "
                         "0 for the trainer)")
        unknown_cuts = self.unknown & ({"top_k", "top_p"} - set(spec.applies))
        if unknown_cuts:
            notes.append(f"{'/'.join(sorted(unknown_cuts))} not known: if the run used them, this framework's "
                         "trainer did not renormalise over them; pass the values to record it")
        return {"source": f"import:{self.fmt}", "field": spec.field, "reading": reading,
                "applies": sorted(spec.applies), "decided_from": spec.source,
                "not_renormalized_sequences": self.n_not_renormalized,
                "copied_from_rollout_sequences": self.n_trainer_copies,
                "zero_probability_tokens": self.n_trainer_zero_prob_tokens, "note": " ".join(notes)}

    def final_attrs(self) -> dict[str, Any]:
        """The attrs of the finished arm (provenance, coordinates, what was supplied, excluded, missing).

        Returns
        -------
        dict
            ``arm``, ``capture_backend``, ``import`` (format, files, coordinates, user-supplied and
            framework-default sampling, missing fields, counts, exclusions, notes),
            ``sampling_unknown`` and, with a trainer side, ``trainer``.
        """
        missing = []
        if self.version_missing:
            missing.append("policy_version")
        if self.reward_missing:
            missing.append("reward")
        if self.finish_missing:
            missing.append("finish_reason")
        if not self.has_trainer and not self.dropped_trainer:
            missing.append("trainer_logprobs")
        if not self.n_prompt_texts:
            missing.append("prompt_text")
        missing += sorted(self.unknown)
        notes = []
        if self.version_missing:
            notes.append("policy_version is 0 where the dump records no version")
        if self.dropped_trainer:
            notes.append("the dump's trainer logprobs were dropped (trainer_reading='none')")
        if not self.has_trainer:
            notes.append("rollout side only: `rlparity score STORE --model MODEL` adds the trainer side")
        if self.n_multi_turn_records:
            notes.append(f"{self.n_multi_turn_records} record(s) held several assistant turns: one sequence "
                         "per turn, in order, sharing prompt_index/sample_index; a turn's prompt is every token before it "
                         "(finish_reason of the earlier turns: unknown; prompt_text only on the first turn)")
        if self.grouped_by_prompt:
            notes.append(f"prompt_index groups samples with identical prompt token ids ({len(self.groups)} prompts; "
                         "the dump records no group)")
        notes += [f"{k} record(s): {note}" for note, k in self.record_notes.items()]
        for e in self.excluded.values():
            notes.append(f"excluded {e['tokens']} token(s) of {e['records']} sample(s) ({e['records_left_empty']} left "
                         f"with none): {e['reason']}")
        if self.n_prompt_texts and self.prompt_tokenization:
            notes.append(f"prompt text of {self.n_prompt_texts} sample(s) kept: `rlparity score STORE --model MODEL` "
                         "tokenizes it as the framework does and checks the engine's prompt ids against it")
        info = {k: v[0] if len(v) == 1 else v for k, v in self.info.items() if k != "file"}
        imp = {
            "format": self.fmt, "file": self.files[0] if len(self.files) == 1 else self.files,
            "coords": self.key.coords(), **info,
            "user_supplied": dict(self.sampling.user),
            "framework_defaults": {k: {"value": self.sampling.framework[k][0], "source": self.sampling.framework[k][1]}
                                   for k in sorted(self.from_framework)},
            "fields_missing": missing,
            "n_records": self.n_records, "n_sequences": self.n_sequences, "n_tokens": self.n_tokens,
            "n_records_without_sampled_tokens": self.n_records_without_sampled_tokens,
            "n_multi_turn_records": self.n_multi_turn_records,
            "excluded": {k: dict(v) for k, v in self.excluded.items()},
            "n_excluded_tokens": sum(e["tokens"] for e in self.excluded.values()),
            **({"prompt_tokenization": self.prompt_tokenization} if self.prompt_tokenization and self.n_prompt_texts
               else {}),
            "notes": notes,
        }
        out: dict[str, Any] = {"arm": self.arm, "capture_backend": f"import:{self.fmt}", "import": imp,
                               "sampling_unknown": sorted(self.unknown, key=SAMPLING_FIELDS.index)}
        trainer = self.trainer_attrs()
        if trainer is not None:
            out["trainer"] = trainer
        return out
