"""The inference-path ablation: change one engine setting at a time, same prompts, same seeds.

From a reference profile (default ``pipelinerl-parity``) every *knob* starts one engine with that
single setting changed, captures the same prompts with the same request seeds and rescores with
the same trainer. A knob the platform cannot honour (the engine refuses to start, or the running
engine reports it kept the reference value, e.g. cascade attention or another attention backend
on CPU) is recorded as *not applicable* with the reason, never dropped.

* :func:`ablation` runs it and returns ``{arm: trace}`` (arm ``reference`` plus one per knob that
  ran); the plan, with the not-applicable knobs and their reasons, is in every arm's
  ``attrs["ablation"]`` so the store alone rebuilds the table.
* :func:`ablation_table` says, per setting, how it moves the rollout logprobs against the trainer
  (backend pair, d = log pi_old - log mu) and against the reference arm (d_ref = log mu_arm -
  log mu_reference, on the tokens both arms sampled identically).
* :func:`batch_composition` probes determinism by batch composition: the same prompt at
  temperature 0 in batches of different sizes (dims ``batch_size``, ``position``).

Prompts share a long common prefix (:func:`shared_prefix_prompts`) and each engine first sees a
short warm-up pass over the same prompts, so prefix caching has cached blocks to hit, as it
has when an RL loop samples the same prompts again.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import xarray as xr

from rlparity._provenance import library_versions, make_attrs
from rlparity.capture.settings import EngineSettings, SamplingSettings
from rlparity.metrics import summary

REFERENCE = "reference"


@dataclass(frozen=True)
class Knob:
    """One engine setting to change: ``field`` of :class:`EngineSettings` set to ``value``.

    ``value=None`` flips a boolean against the reference engine's effective value.
    ``effective_key`` is the key of the effective configuration that shows whether the engine
    honoured it (default: ``field``).
    """

    name: str
    field: str
    value: Any = None
    description: str = ""
    effective_key: str | None = None

    @property
    def key(self) -> str:
        return self.effective_key or self.field


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("prefix_caching", "enable_prefix_caching", None, "reuse cached KV blocks of shared prefixes"),
    Knob("async_scheduling", "async_scheduling", None, "overlap scheduling with the previous step"),
    Knob("cascade_attention", "disable_cascade_attn", None, "cascade attention for shared prefixes (GPU)"),
    Knob("attention_backend", "attention_backend", "FLEX_ATTENTION", "another attention kernel"),
    Knob("eager", "enforce_eager", None, "eager vs compiled (torch.compile / CUDA graphs)"),
    Knob("batch_invariant", "batch_invariant", True, "batch-invariant kernels (VLLM_BATCH_INVARIANT=1)"),
    Knob("max_num_seqs", "max_num_seqs", 2, "batch size cap: other batch composition"),
    Knob("chunked_prefill", "enable_chunked_prefill", None, "split prefills across steps"),
)}
DEFAULT_KNOBS = tuple(KNOBS)


def shared_prefix_prompts(n: int, *, prefix_problems: int = 32, seed: int = 0) -> list[str]:
    """``n`` task prompts that share a long common prefix (``prefix_problems`` solved problems,
    about 10 characters = tokens each for the tiny model) and end in a different open problem,
    so prefix caching and cascade attention have shared full KV blocks to work on (vLLM's CPU
    backend uses blocks of 128 tokens; a prefix shorter than one block is never cached)."""
    import random

    from rlparity.models import make_problem

    rng = random.Random(seed)
    prefix = "".join(make_problem(rng) for _ in range(prefix_problems))
    out = []
    for _ in range(n):
        own = make_problem(rng)
        nxt = make_problem(rng)
        out.append(prefix + own + nxt[: nxt.index("=") + 1])
    return out


def _effective_value(eff: Mapping[str, Any], knob: Knob) -> Any:
    v = eff.get(knob.key)
    return v.upper() if isinstance(v, str) and knob.field == "attention_backend" else v


def knob_settings(knob: Knob, reference: EngineSettings, reference_effective: Mapping[str, Any]
                  ) -> tuple[EngineSettings, Any]:
    """The reference settings with ``knob`` changed, and the value it was changed to."""
    value = knob.value
    if value is None:
        current = reference_effective.get(knob.key, getattr(reference, knob.field))
        if not isinstance(current, bool):
            raise ValueError(f"knob {knob.name}: cannot flip {knob.key}={current!r} (not a boolean); "
                             "give the knob an explicit value")
        value = not current
    return reference.replace(**{knob.field: value}), value


def _takes(knob: Knob, value: Any, eff: Mapping[str, Any]) -> tuple[bool, Any]:
    """Whether the effective configuration ``eff`` has ``knob`` at ``value``, and what it has."""
    got = _effective_value(eff, knob)
    return got == (value.upper() if isinstance(value, str) else value), got


def _honoured(knob: Knob, value: Any, eff: Mapping[str, Any], ref_eff: Mapping[str, Any]) -> str | None:
    """``None`` if the engine runs with ``value``; else why the knob is not applicable."""
    if knob.key not in eff:
        return f"the engine does not report {knob.key}, so the change cannot be verified"
    ok, got = _takes(knob, value, eff)
    if ok:
        return None
    return (f"asked for {knob.field}={value!r}, the running engine reports {knob.key}={got!r} "
            f"(reference: {_effective_value(ref_eff, knob)!r}): this platform does not honour it")


def _error_chain(err: BaseException) -> str:
    """The messages of an exception and its causes (vLLM wraps the worker's error)."""
    parts, seen = [], set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(traceback.format_exception_only(type(e), e)[-1].strip())
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)[:600]


def resolved_reason(model: str, knob: Knob, settings: EngineSettings, value: Any) -> str | None:
    """Why vLLM's own configuration step (``EngineArgs.create_engine_config``, no engine started)
    already drops the knob on this platform; ``None`` if it keeps it or the check does not apply
    (settings given through the environment are only visible in a started engine)."""
    from rlparity.capture._common import cpu_defaults

    if settings.env():
        return None
    from rlparity.capture.audit import resolve_kwargs

    try:
        eff = resolve_kwargs({**cpu_defaults(settings), "model": model, **settings.to_engine_kwargs()})
    except Exception:
        return None  # let the real start say what is wrong
    ok, got = _takes(knob, value, eff)
    if knob.key in eff and not ok:
        return (f"vLLM {library_versions()['vllm'] or '?'} resolves {knob.field}={value!r} to {knob.key}={got!r} on this platform "
                "(EngineArgs.create_engine_config, before any engine starts): not honoured here")
    return None


def _warm(engine, prompts, sampling: SamplingSettings) -> None:
    """A prefill-only pass over the prompts (fills the prefix cache, as an earlier RL step would)."""
    engine.capture(list(prompts), sampling.model_copy(update={"max_tokens": 1}), progress=False)


def ablation(model: str | os.PathLike, prompts: Sequence, sampling: SamplingSettings | None = None, *,
             reference: str | os.PathLike | EngineSettings = "pipelinerl-parity",
             knobs: Sequence[str | Knob] = DEFAULT_KNOBS, engine: Mapping[str, Any] | None = None,
             scorer=None, pool=None, warmup: bool = True, batch_sizes: Sequence[int] | None = (1, 2, 4, 8),
             batch_prompt: str | None = None, batch_max_tokens: int = 16,
             progress: bool = False) -> dict[str, xr.Dataset]:
    """Run the reference and one arm per knob; return ``{arm: scored trace}``.

    ``reference`` is a profile name, a YAML path or :class:`EngineSettings`; ``engine`` holds
    overrides applied to it for every arm (e.g. ``{"dtype": "float32"}`` to pin the body to the
    trainer's precision so the path differences are not buried under the dtype gap).
    ``scorer`` is a :class:`rlparity.score.Scorer` (default: fp32 body and head). With
    ``batch_sizes``, every arm's engine also runs :func:`batch_composition` (stored in the arm as
    ``batch_*`` variables). Engines come from ``pool`` (default: the shared pool), one at a time.
    """
    from rlparity.capture.pool import shared_pool
    from rlparity.capture.profiles import load_profile
    from rlparity.score import Scorer

    if not len(prompts):
        raise ValueError("ablation needs at least one prompt")
    knob_list = []
    for k in knobs:
        if isinstance(k, Knob):
            knob_list.append(k)
        elif k in KNOBS:
            knob_list.append(KNOBS[k])
        else:
            raise ValueError(f"unknown knob {k!r}; built-in knobs: {', '.join(KNOBS)} "
                             "(or pass rlparity.experiments.ablation.Knob(...))")
    ref_settings = load_profile(reference)
    if engine:
        ref_settings = ref_settings.replace(**dict(engine))
    sampling = sampling or SamplingSettings(temperature=0.7, top_k=20, max_tokens=24, seed=0)
    pool = pool or shared_pool()
    scorer = scorer or Scorer(model, dtype="float32", head_dtype="float32", progress=progress)
    ref_name = reference if isinstance(reference, str) else getattr(reference, "name", "settings")
    plan: list[dict[str, Any]] = []

    def run(arm: str, settings: EngineSettings) -> tuple[xr.Dataset, dict]:
        eng = pool.get(model, settings)
        if warmup:
            _warm(eng, prompts, sampling)
        tr = eng.capture(list(prompts), sampling, arm=arm, progress=progress)
        if batch_sizes:
            bc = batch_composition(eng, batch_prompt or prompts[0], batch_sizes=batch_sizes,
                                   fillers=prompts[1:], max_tokens=batch_max_tokens)
            tr = tr.assign({f"batch_{k}": v for k, v in bc.data_vars.items()})
            tr = tr.assign_coords(bc.coords)
        return scorer.score(tr), tr.attrs["engine_effective"]

    arms: dict[str, xr.Dataset] = {}
    ref_trace, ref_eff = run(REFERENCE, ref_settings)
    arms[REFERENCE] = ref_trace
    plan.append({"arm": REFERENCE, "knob": REFERENCE, "field": "", "value": "", "reference_value": "",
                 "status": "ran", "reason": f"profile {ref_name} with {dict(engine or {})}"})
    for knob in knob_list:
        entry = {"arm": knob.name, "knob": knob.name, "field": knob.field, "description": knob.description,
                 "reference_value": _effective_value(ref_eff, knob)}
        try:
            settings, value = knob_settings(knob, ref_settings, ref_eff)
        except ValueError as err:
            plan.append({**entry, "value": knob.value, "status": "not_applicable", "reason": str(err)})
            continue
        entry["value"] = value
        pre = resolved_reason(str(model), knob, settings, value)
        if pre is not None:
            plan.append({**entry, "status": "not_applicable", "reason": pre})
            continue
        try:
            trace, eff = run(knob.name, settings)
        except Exception as err:  # the engine refused the setting: recorded, not dropped
            pool.close()
            plan.append({**entry, "status": "not_applicable",
                         "reason": f"the engine did not start with {knob.field}={value!r}: {_error_chain(err)} "
                                   "(the engine log above has the worker's traceback)"})
            continue
        reason = _honoured(knob, value, eff, ref_eff)
        if reason is not None:
            plan.append({**entry, "status": "not_applicable", "reason": reason})
            continue
        plan.append({**entry, "status": "ran", "reason": ""})
        arms[knob.name] = trace
    record = {"reference": str(ref_name), "overrides": dict(engine or {}), "warmup": warmup,
              "knobs": [asdict(k) for k in knob_list], "plan": plan}
    for name, tr in arms.items():
        tr.attrs["arm"] = name
        tr.attrs["ablation"] = {**record, "knob": name}
    return arms


# ------------------------------------------------------------------------------ comparison
def ablation_plan(arms: Mapping[str, xr.Dataset]) -> list[dict[str, Any]]:
    """The plan recorded in the arms' attrs: per knob its field, typed value, status and reason."""
    for tr in arms.values():
        rec = tr.attrs.get("ablation")
        if rec:
            return list(rec["plan"])
    raise ValueError("these arms were not made by rlparity.experiments.ablation.ablation "
                     "(no 'ablation' attr); run ablation() or pass its store")


def is_ablation(arms: Mapping[str, xr.Dataset]) -> bool:
    return any("ablation" in tr.attrs for tr in arms.values())


def _aligned(trace: xr.Dataset, reference: xr.Dataset) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """``d_ref`` per (arm sequence, position) on identically sampled tokens up to each sequence's
    first divergence (NaN elsewhere), and per matched pair its divergence and token counts."""
    def key(ds):
        return list(zip(ds["prompt_index"].values.tolist(), ds["sample_index"].values.tolist()))

    idx_r = {k: i for i, k in enumerate(key(reference))}
    common = [(i, idx_r[k]) for i, k in enumerate(key(trace)) if k in idx_r]
    if not common:
        raise ValueError("the arm and the reference share no (prompt_index, sample_index)")
    ta, tr_ = trace["token_id"].values, reference["token_id"].values
    la, lr = trace["rollout_logprob"].values, reference["rollout_logprob"].values
    ma, mr = trace["response_mask"].values.astype(bool), reference["response_mask"].values.astype(bool)
    pa, pr = trace["prompt_token_id"].values, reference["prompt_token_id"].values
    T = min(ta.shape[1], tr_.shape[1])
    d = np.full((ta.shape[0], T), np.nan)
    pairs = []
    for i, j in common:
        both = ma[i, :T] & mr[j, :T]
        bad = np.flatnonzero(both & (ta[i, :T] != tr_[j, :T]))
        L = int(bad[0]) if bad.size else T
        sel = both.copy()
        sel[L:] = False
        d[i, sel] = la[i, :T][sel] - lr[j, :T][sel]
        n_both = int(both.sum())
        pairs.append({"first_divergence": L, "n_both": n_both, "n_compared": int(sel.sum()),
                      "identical": not bad.size and n_both == int(ma[i].sum()) == int(mr[j].sum()),
                      "prompt_same": pa.shape == pr.shape and np.array_equal(pa[i], pr[j])})
    return d, pairs


def reference_log_ratio(trace: xr.Dataset, reference: xr.Dataset) -> np.ndarray:
    """``d_ref = log mu_arm - log mu_reference`` (nats) per (sequence, position) of ``trace``, on
    the tokens both arms sampled identically up to the first divergence; NaN elsewhere."""
    return _aligned(trace, reference)[0]


def reference_diff(trace: xr.Dataset, reference: xr.Dataset) -> dict[str, Any]:
    """Rollout logprobs of ``trace`` against the reference arm on identically sampled tokens.

    Sequences are matched by ``(prompt_index, sample_index)``; per sequence the comparison runs
    up to the first position where the sampled token ids differ (after it the two arms condition
    on different text). ``d_ref = log mu_arm - log mu_reference`` (nats).
    """
    d, pairs = _aligned(trace, reference)
    d = d[np.isfinite(d)]
    n = len(pairs)
    first_div = [p["first_divergence"] for p in pairs if not p["identical"]]
    total = sum(p["n_both"] for p in pairs)
    return {
        "abs_log_ratio_mean": float(np.abs(d).mean()) if d.size else float("nan"),
        "abs_log_ratio_max": float(np.abs(d).max()) if d.size else float("nan"),
        "mean_ratio": float(np.exp(d).mean()) if d.size else float("nan"),
        "bitwise_equal_share": float((d == 0).mean()) if d.size else float("nan"),
        "identical_sequences": sum(p["identical"] for p in pairs) / n,
        "first_divergence_mean": float(np.mean(first_div)) if first_div else float("nan"),
        "compared_token_share": sum(p["n_compared"] for p in pairs) / total if total else float("nan"),
        "n_sequences": n,
        "prompts_identical": sum(p["prompt_same"] for p in pairs) / n,
    }


TABLE_VARIABLES = {
    "trainer_abs_log_ratio_mean": "mean |d| vs trainer (d = log pi_old - log mu)",
    "trainer_mean_ratio": "mean pi_old/mu vs trainer",
    "trainer_abs_log_ratio_max": "max |d| vs trainer",
    "reference_abs_log_ratio_mean": "mean |d_ref| vs reference arm (d_ref = log mu_arm - log mu_ref)",
    "reference_mean_ratio": "mean mu_arm/mu_ref on identically sampled tokens",
    "reference_abs_log_ratio_max": "max |d_ref| vs reference arm",
    "reference_identical_sequences": "share of sequences with the reference's exact tokens",
    "reference_first_divergence_mean": "mean position of the first token that differs from the reference",
    "reference_bitwise_equal_share": "share of compared tokens with bitwise-equal logprobs",
    "cached_prompt_token_share": "share of prompt tokens served from the prefix cache",
    "batch_distinct_outputs": "distinct greedy outputs of one prompt over batch sizes",
    "batch_logprob_spread": "max over positions of (max - min) greedy logprob over batch sizes",
}


def ablation_table(data, *, trainer: str = "processed") -> xr.Dataset:
    """Per setting (dim ``setting``, the reference first): status, field, value, and how the arm
    moves the logprobs vs the trainer and vs the reference arm; not-applicable knobs keep their
    row with NaN metrics and the reason."""
    from rlparity.trace import as_arms, has_trainer

    arms = as_arms(data)
    plan = ablation_plan(arms)
    if REFERENCE not in arms:
        raise ValueError(f"no {REFERENCE!r} arm in the store (arms: {', '.join(arms)})")
    ref = arms[REFERENCE]
    rows = []
    for entry in plan:
        row = {"setting": entry["arm"], "status": entry["status"], "field": entry.get("field", ""),
               "value": str(entry.get("value", "")), "reference_value": str(entry.get("reference_value", "")),
               "reason": entry.get("reason", "")}
        tr = arms.get(entry["arm"]) if entry["status"] == "ran" else None
        nums = dict.fromkeys(TABLE_VARIABLES, np.nan)
        if tr is not None:
            if has_trainer(tr):
                s = summary(tr, trainer)  # type: ignore[arg-type]
                nums["trainer_abs_log_ratio_mean"] = float(s["abs_log_ratio_mean"])
                nums["trainer_mean_ratio"] = float(s["mean_ratio"])
                nums["trainer_abs_log_ratio_max"] = float(s["abs_log_ratio_max"])
            cached = tr["cached_prompt_tokens"].values if "cached_prompt_tokens" in tr else np.array([-1])
            if (cached >= 0).all():
                nums["cached_prompt_token_share"] = float(cached.sum() / max(int(tr["prompt_length"].sum()), 1))
            r = reference_diff(tr, ref)
            for k in ("abs_log_ratio_mean", "mean_ratio", "abs_log_ratio_max", "identical_sequences",
                      "first_divergence_mean", "bitwise_equal_share"):
                nums[f"reference_{k}"] = r[k]
            if "batch_token_id" in tr:
                b = batch_summary(tr)
                nums["batch_distinct_outputs"] = b["distinct_outputs"]
                nums["batch_logprob_spread"] = b["logprob_spread"]
        rows.append({**row, **nums})
    settings = [r["setting"] for r in rows]
    out = xr.Dataset(coords={"setting": settings})
    for k in ("status", "field", "value", "reference_value", "reason"):
        out[k] = ("setting", np.array([r[k] for r in rows], dtype=object).astype(str))
    for k, desc in TABLE_VARIABLES.items():
        out[k] = ("setting", np.array([r[k] for r in rows], dtype=float))
        out[k].attrs["long_name"] = desc
        if "log_ratio" in k or k.endswith("spread"):
            out[k].attrs["units"] = "nats"
    out.attrs = make_attrs(kind="ablation_table", trainer=trainer, reference=REFERENCE,
                           pair_trainer="backend (pi_old, mu), d = log pi_old - log mu",
                           pair_reference="arm vs reference, d_ref = log mu_arm - log mu_reference")
    return out


def moved_settings(table: xr.Dataset, *, tol_reference: float = 0.0, tol_trainer: float = 1e-3
                   ) -> dict[str, list[str]]:
    """Which metrics each ran setting moves: ``{"setting": ["reference logprobs", "tokens",
    "trainer gap", "batch determinism"]}`` (settings that move nothing map to ``[]``); batch
    determinism moves when the distinct greedy outputs or the logprob spread differ from the
    reference arm's.

    ``tol_reference`` (nats): max ``|d_ref|`` and batch logprob spread above it count as moved
    (default 0: any bitwise difference); ``tol_trainer`` (nats): the change of mean ``|d|`` against
    the trainer above which the setting moves the gap itself."""
    out: dict[str, list[str]] = {}
    ref = table.sel(setting=REFERENCE)
    ref_gap = float(ref["trainer_abs_log_ratio_mean"])
    for s in table["setting"].values.tolist():
        if s == REFERENCE or str(table["status"].sel(setting=s).item()) != "ran":
            continue
        row = table.sel(setting=s)
        moved = []
        if float(row["reference_abs_log_ratio_max"]) > tol_reference:
            moved.append("reference logprobs")
        if float(row["reference_identical_sequences"]) < 1.0:
            moved.append("tokens")
        if abs(float(row["trainer_abs_log_ratio_mean"]) - ref_gap) > tol_trainer:
            moved.append("trainer gap")
        # batch determinism against the reference's own: a GPU reference is rarely batch-invariant
        d_out = float(row["batch_distinct_outputs"]) - float(ref["batch_distinct_outputs"])
        d_spread = float(row["batch_logprob_spread"]) - float(ref["batch_logprob_spread"])
        if (np.isfinite(d_out) and d_out != 0) or (np.isfinite(d_spread) and abs(d_spread) > tol_reference):
            moved.append("batch determinism")
        out[s] = moved
    return out


# ------------------------------------------------------------------------------ batch composition
def batch_composition(engine, prompt, *, batch_sizes: Sequence[int] = (1, 2, 4, 8), fillers: Sequence = (),
                      max_tokens: int = 16) -> xr.Dataset:
    """The same ``prompt`` at temperature 0 inside batches of each size (the other requests are
    ``fillers``, cycled): the greedy tokens and logprobs it gets in each (dims ``batch_size``,
    ``batch_position``). In a batch-invariant engine every row is identical."""
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
    fill = list(fillers) or [prompt]
    greedy = SamplingSettings(temperature=0.0, max_tokens=max_tokens, seed=0)
    tokens = np.full((len(sizes), max_tokens), -1, dtype=np.int64)
    logps = np.full((len(sizes), max_tokens), np.nan)
    for i, b in enumerate(sizes):
        batch = [prompt] + [fill[j % len(fill)] for j in range(b - 1)]
        tr = engine.capture(batch, greedy, progress=False)
        row = int(np.flatnonzero(tr["prompt_index"].values == 0)[0])
        m = tr["response_mask"].values[row].astype(bool)
        n = min(int(m.sum()), max_tokens)
        tokens[i, :n] = tr["token_id"].values[row][m][:n]
        logps[i, :n] = tr["rollout_logprob"].values[row][m][:n]
    return xr.Dataset(
        {"token_id": (("batch_size", "batch_position"), tokens),
         "logprob": (("batch_size", "batch_position"), logps, {"units": "nats"})},
        coords={"batch_size": sizes, "batch_position": np.arange(max_tokens)},
    )


def batch_summary(trace: xr.Dataset) -> dict[str, Any]:
    """Distinct greedy outputs over batch sizes and the logprob spread on the common prefix."""
    tok = trace["batch_token_id"].values
    lp = trace["batch_logprob"].values
    distinct = len({tuple(r.tolist()) for r in tok})
    same = np.all(tok == tok[:1], axis=0)
    L = int(np.argmin(same)) if not same.all() else tok.shape[1]
    spread = lp[:, :L].max(axis=0) - lp[:, :L].min(axis=0) if L else np.zeros(0)
    spread = spread[np.isfinite(spread)]
    return {"distinct_outputs": distinct, "common_prefix": L,
            "logprob_spread": float(spread.max()) if spread.size else 0.0,
            "batch_sizes": trace["batch_size"].values.tolist()}


def batch_table(data) -> xr.Dataset:
    """Per setting that ran: distinct greedy outputs, common prefix length, logprob spread."""
    from rlparity.trace import as_arms

    arms = as_arms(data)
    rows = {k: batch_summary(v) for k, v in arms.items() if "batch_token_id" in v}
    if not rows:
        raise ValueError("no arm has batch-composition data (run ablation(..., batch_sizes=...))")
    names = list(rows)
    out = xr.Dataset(
        {"distinct_outputs": ("setting", [rows[k]["distinct_outputs"] for k in names]),
         "common_prefix": ("setting", [rows[k]["common_prefix"] for k in names]),
         "logprob_spread": ("setting", [rows[k]["logprob_spread"] for k in names], {"units": "nats"})},
        coords={"setting": names})
    out.attrs = make_attrs(kind="batch_composition_table",
                           batch_sizes=next(iter(rows.values()))["batch_sizes"])
    return out


__all__ = ["DEFAULT_KNOBS", "KNOBS", "REFERENCE", "TABLE_VARIABLES", "Knob", "ablation", "ablation_plan",
           "ablation_table", "batch_composition", "batch_summary", "batch_table", "is_ablation", "knob_settings",
           "moved_settings", "reference_diff", "reference_log_ratio", "shared_prefix_prompts"]
