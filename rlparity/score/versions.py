"""Rescoring with the weights of each policy version: every token scored by the version that sampled
it (in-flight updates), and optionally every token by the latest weights too."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from rlparity.score.prompts import tokenize_prompts
from rlparity.score.scorer import Scorer
from rlparity.trace import arm_record, latest_version, token_checksum, trace_versions, validate
from rlparity.trace.schema import TOKEN_DIMS, annotate

__all__ = ["LATEST_VARS", "ROUTED_VARS", "TOKEN_TRAINER_VARS", "score_versions"]


TOKEN_TRAINER_VARS = ("trainer_logprob", "trainer_processed_logprob", "trainer_entropy",
                      "trainer_processed_entropy", "trainer_max_logit", "trainer_log_kept_mass", "trainer_token_rank",
                      "trainer_cut_margin")
# a MoE trainer's variables over (sequence, position[, moe_layer[, expert_slot]]), merged per version too
ROUTED_VARS = ("trainer_routed_experts", "trainer_router_margin", "trainer_replay_logprob",
               "trainer_replay_processed_logprob")
LATEST_VARS = {"trainer_logprob": "trainer_latest_logprob",
               "trainer_processed_logprob": "trainer_latest_processed_logprob"}


def score_versions(trace: xr.Dataset, checkpoints: Any, *, latest: bool | int = True,
                   **scorer_kwargs: Any) -> xr.Dataset:
    """Rescore ``trace`` so that every token is scored by the weights that produced it.

    ``checkpoints`` maps a policy version to its weights: a checkpoint path or hub id, a loaded
    transformers model, or a ready :class:`~rlparity.score.scorer.Scorer` (reused as is; the others are made with
    ``scorer_kwargs``, e.g. ``dtype``, ``head_dtype``, ``device``). For each version one forward runs
    over the sequences that contain it, and each token takes its values (``trainer_logprob``,
    ``trainer_processed_logprob``, entropies, ...) from its own version's forward, so
    ``d = log pi_old - log mu`` compares like with like even for sequences that straddle an update.

    ``latest`` (True: :func:`~rlparity.trace.schema.latest_version`; or a version) also scores every token with the latest
    weights into ``trainer_latest_logprob`` / ``trainer_latest_processed_logprob``: what an
    on-policy trainer that ignores versions computes; the gap between the two readings is the
    off-policy share of the mismatch. ``False`` skips it.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with ``policy_version``.
    checkpoints : Mapping
        Policy version to a checkpoint path or hub id, a loaded model, or a :class:`~rlparity.score.scorer.Scorer`.
    latest : bool or int, default True
        Also score every token with the latest weights (True), with this version's, or not (False).
    **scorer_kwargs
        Arguments of the :class:`~rlparity.score.scorer.Scorer` made for each version that is not one already.

    Returns
    -------
    xarray.Dataset
        The trace scored token by token by its own version's weights.
    """
    trace, ckpts, versions, latest_v = _versions_to_score(trace, checkpoints, latest)

    def scorer(v: int) -> Scorer:
        c = ckpts[v]
        return c if isinstance(c, Scorer) else Scorer(c, **{"progress": False, **scorer_kwargs})

    pv = trace["policy_version"].values
    mask = trace["response_mask"].values.astype(bool)
    n, width = trace.sizes["sequence"], trace.sizes["position"]
    merged = _Merged.empty(n, width)
    t0 = time.perf_counter()
    order = ([latest_v] if latest_v is not None else []) + [v for v in versions if v != latest_v]
    for v in order:
        sc = scorer(v)
        merged.names[str(v)] = sc.model_name
        if v == latest_v:
            rows = np.arange(n)
        else:
            rows = np.flatnonzero(((pv == v) & mask).any(axis=1))
        scored = sc.score(trace.isel(sequence=rows))
        merged.record(v, sc, scored)
        if v == latest_v:
            merged.latest = {dst: scored[src].values for src, dst in LATEST_VARS.items()}
        if v in versions:
            merged.take_own(scored, rows, (pv[rows] == v) & mask[rows])
        del sc
    return _assemble(trace, merged, latest_v, t0)


def _versions_to_score(trace: xr.Dataset, checkpoints: Any, latest: bool | int | None
                       ) -> tuple[xr.Dataset, dict[int, Any], list[int], int | None]:
    """The trace to score (a copy without its old record of the scored tokens), the checkpoints by
    version, the trace's versions and the latest version to score every token with (None: none);
    refuses checkpoints that are no mapping or miss a version."""
    from collections.abc import Mapping

    validate(trace)
    # a trace scored before is scored again: its old record of which tokens were scored covers every
    # sequence, so the per-version subsets below would fail it (the new scoring writes its own)
    trace = trace.copy()
    trace.attrs = {k: v for k, v in trace.attrs.items() if k != "scored_token_checksum"}
    if not isinstance(checkpoints, Mapping) or not checkpoints:
        raise TypeError("checkpoints must map policy version -> checkpoint path, model or Scorer, "
                        "e.g. {0: 'ckpt-v0', 1: 'ckpt-v1'}")
    ckpts = {int(k): v for k, v in checkpoints.items()}
    versions = trace_versions(trace)
    latest_v = None if latest is False or latest is None else (latest_version(trace) if latest is True else int(latest))
    needed = sorted(set(versions) | ({latest_v} if latest_v is not None else set()))
    missing = [v for v in needed if v not in ckpts]
    if missing:
        raise ValueError(f"no checkpoint for policy version(s) {missing}: the trace's tokens come from versions "
                         f"{versions}{f' (latest {latest_v})' if latest_v is not None else ''}; pass "
                         "checkpoints={version: path_or_model, ...} for each")
    return trace, ckpts, versions, latest_v


@dataclass
class _Merged:
    """What the per-version scorings gather: each token's values from its own version's forward, the
    latest weights' reading of every token, and per version the model, weight checksums and
    self-check; the first scoring (and its scorer) gives the rest of the scored trace."""

    n: int
    width: int
    result: dict[str, np.ndarray]
    routed: dict[str, np.ndarray] = field(default_factory=dict)  # a MoE trainer's router variables and replay readings
    latest: dict[str, np.ndarray] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    sums: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    base: xr.Dataset | None = None
    first: Scorer | None = None

    @classmethod
    def empty(cls, n: int, width: int) -> _Merged:
        return cls(n, width, {k: np.full((n, width), -1 if k == "trainer_token_rank" else np.nan,
                                         dtype=np.int64 if k == "trainer_token_rank" else np.float64)
                              for k in TOKEN_TRAINER_VARS})

    def record(self, v: int, sc: Scorer, scored: xr.Dataset) -> None:
        """Version ``v``'s weight checksums and self-check; the first scoring is kept whole."""
        self.sums[str(v)] = arm_record(scored).scorer.weight_checksums
        self.checks[str(v)] = arm_record(scored).scorer.self_check
        if self.base is None:
            self.base, self.first = scored, sc

    def take_own(self, scored: xr.Dataset, rows: np.ndarray, own: np.ndarray) -> None:
        """The values of the tokens ``own`` (of the sequences ``rows``) from this version's ``scored``."""
        for k in TOKEN_TRAINER_VARS:
            block = self.result[k][rows]
            block[own] = scored[k].values[own]
            self.result[k][rows] = block
        for k in ROUTED_VARS:
            if k in scored:
                if k not in self.routed:
                    fill = -1 if scored[k].dtype.kind == "i" else np.nan
                    self.routed[k] = np.full((self.n, self.width, *scored[k].shape[2:]), fill, dtype=scored[k].dtype)
                block = self.routed[k][rows]
                block[own] = scored[k].values[own]
                self.routed[k][rows] = block


def _assemble(trace: xr.Dataset, merged: _Merged, latest_v: int | None, t0: float) -> xr.Dataset:
    """The scored trace from the merged per-version readings, with the trainer's provenance per version."""
    base, first, names = merged.base, merged.first, merged.names
    n = merged.n
    assert base is not None
    out = trace.copy()
    for k, arr in {**merged.result, **merged.latest}.items():
        out[k] = (TOKEN_DIMS, arr)
    if merged.routed:
        out = out.assign_coords(moe_layer=base["moe_layer"].values, expert_slot=base["expert_slot"].values)
        for k, arr in merged.routed.items():
            out[k] = (base[k].dims, arr)
        out.attrs["trainer_router"] = arm_record(base).trainer_router
    assert first is not None
    for k, arr in first.applied_sampling(trace).items():
        out[k] = (("sequence",), arr)
    if "trainer_prompt_token_id" in base and base.sizes["sequence"] == n:
        out["trainer_prompt_token_id"] = base["trainer_prompt_token_id"]
        out["trainer_prompt_length"] = base["trainer_prompt_length"]
    elif first is not None and first.tokenize_prompts:
        out = tokenize_prompts(out, first.tokenizer, add_special_tokens=first.special_tokens(trace))
    trainer_attrs = arm_record(base).scorer.to_attrs()
    trainer_attrs.update({"model": names.get(str(latest_v), next(iter(names.values()))),
                          "scored_by": "policy_version", "per_version": names, "latest_version": latest_v,
                          "weight_checksums": None, "weight_checksums_per_version": merged.sums,
                          "self_check_per_version": merged.checks,
                          "score_s": round(time.perf_counter() - t0, 3)})
    out.attrs.update({"trainer": trainer_attrs, "scored_token_checksum": token_checksum(trace)})
    return validate(annotate(out))
