"""The inflight weight-update experiment: pause mode x cache clearing x prefix caching.

Every arm runs the same steps on a real ``AsyncLLM`` (:class:`rlparity.capture.AsyncEngine`):

1. the engine runs version 0 with a fresh prefix cache (between arms the version-0 weights are
   loaded back and the cache is reset);
2. a prefill-only pass over the prompts fills the prefix cache with version-0 KV (as an earlier
   RL step would: the prompts share a prefix longer than one KV block);
3. the prompts are sampled; once about a third of their tokens have streamed, the weights are
   updated to version 1 with the arm's pause ``mode`` (keep, wait, abort) and ``clear_cache``
   (aborted requests are resubmitted, as an RL loop would);
4. new prompts with the same prefix are sampled after the update: with prefix caching on and the
   cache kept, their prefix KV comes from version 0 (the stale cache);
5. every token is rescored by the trainer with the weights of its own version
   (:func:`rlparity.score.score_versions`) and with the latest weights (``trainer_latest_*``).

Version 1 is a real weight change that both sides load from the same files: by default a
deterministic perturbation of the model (:func:`rlparity.capture.checkpoints.perturbed_checkpoint`), or
any checkpoint directory (e.g. saved after :func:`rlparity.train.train_step`). One engine starts per
prefix-caching setting; its arms reuse it.

:func:`inflight_matrix` returns ``{arm: scored trace}`` (arms labelled ``keep-noclear-prefix_on`` ...,
:func:`rlparity.metrics.inflight.arm_name`; factors ``mode``, ``clear_cache``, ``prefix_caching`` in each trace's
attrs, :func:`rlparity.trace.factors`); tables are in :mod:`rlparity.metrics.inflight`,
findings in :mod:`rlparity.diagnose.inflight`, figures in :mod:`rlparity.plot.inflight`.

Run it from a shell (one call, e.g. on a GPU host with ``RLPARITY_ENGINE_LOCK=off``)::

    rlparity experiment inflight --out DIR [--model PATH | --size tiny] [--device cuda] [--ci]

which writes ``DIR/inflight.zarr`` (every arm) and ``DIR/inflight.json`` (tables, ratios, findings).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.config.defaults import default_sampling
from rlparity.config.logs import progress_log
from rlparity.config.profiles import reference_engine
from rlparity.config.settings import EngineSettings, SamplingSettings, with_overrides
from rlparity.metrics.inflight import PAUSE_MODES, arm_name


def base_settings(dtype: str = "float32", **changes: Any) -> EngineSettings:
    r"""The engine of every arm.

    Processed logprobs, fp32 LM head, the model's generation config ignored, the body in ``dtype``
    (pinned to the trainer's, so the update is what moves ``d``).

    Parameters
    ----------
    dtype : str, default "float32"
        The body dtype.
    \*\*changes
        Further :class:`~rlparity.config.settings.EngineSettings` fields.

    Returns
    -------
    EngineSettings
        The settings.
    """
    return reference_engine(dtype=dtype, **changes)


@dataclass(frozen=True)
class InflightSettings:
    """The settings of :func:`inflight_matrix`, with their defaults.

    Parameters
    ----------
    modes : sequence of str, default PAUSE_MODES
        The pause modes of the arms (``keep``, ``wait``, ``abort``).
    clear_cache : sequence of bool, default (False, True)
        Whether the update resets the prefix cache; every mode runs with each.
    prefix_caching : sequence of bool, default (True, False)
        One engine per setting; its arms reuse it.
    sigma : float, default 0.05
        Relative Gaussian noise of version 1's perturbation.
    seed : int, default 0
        Seeds the perturbation and picks the default prompts.
    n_prompts : int, default 8
        Default prompts each across and after the update.
    max_tokens : int, default 48
        Tokens per request (of the default sampling).
    update_after : float, default 1/3
        The share of the first capture's tokens (``len(prompts) x max_tokens``) streamed before
        the update, in (0, 1).
    resubmit_aborted : bool, default True
        Resubmit requests an ``abort`` update aborted, as an RL loop would.
    dtype : str, default "float32"
        The body dtype pinned on both sides.
    device : str, default "cpu"
        The trainer's device.
    batch_size : int, default 16
        The trainer's batch size.
    """

    modes: Sequence[str] = PAUSE_MODES
    clear_cache: Sequence[bool] = (False, True)
    prefix_caching: Sequence[bool] = (True, False)
    sigma: float = 0.05
    seed: int = 0
    n_prompts: int = 8
    max_tokens: int = 48
    update_after: float = 1 / 3
    resubmit_aborted: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 16


def inflight_matrix(model: str | os.PathLike, prompts: Sequence | None = None, after_prompts: Sequence | None = None,
                    sampling: SamplingSettings | None = None, *, new_weights: str | os.PathLike | None = None,
                    checkpoint_dir: str | os.PathLike | None = None, engine: Mapping[str, Any] | None = None,
                    scorers: Mapping[int, Any] | None = None, settings: InflightSettings | None = None,
                    progress: bool = False, log=progress_log, **overrides: Any) -> dict[str, xr.Dataset]:
    r"""Run every (mode, clear_cache) arm on one engine per prefix-caching setting; return the arms scored per version.

    Starts engines itself (closing the shared pool first: one engine at a time). The settings are
    the fields of :class:`InflightSettings`: give them as keywords, or as ``settings=`` (keywords
    beside it replace its fields).

    Parameters
    ----------
    model : str or os.PathLike
        Version 0: a local checkpoint directory (its weights are loaded back between arms).
    prompts : sequence, optional
        Sampled across the update; ``None`` means ``n_prompts`` from
        :func:`rlparity.experiments.ablation.shared_prefix_prompts` (one long prefix shared by all).
    after_prompts : sequence, optional
        Sampled after the update; ``None`` means ``n_prompts`` more of the same kind.
    sampling : SamplingSettings, optional
        ``None`` means :func:`rlparity.config.defaults.default_sampling` with ``max_tokens``.
    new_weights : str or os.PathLike, optional
        Version 1, a checkpoint directory; ``None`` means ``model`` perturbed by relative Gaussian
        noise ``sigma`` (``seed``).
    checkpoint_dir : str or os.PathLike, optional
        Where the perturbed version 1 is written; ``None`` means ``<model>-inflight-v1`` beside the model.
    engine : Mapping, optional
        Other :class:`~rlparity.config.settings.EngineSettings` fields.
    scorers : Mapping of int to Scorer, optional
        Ready :class:`rlparity.score.Scorer` per version; the missing ones are made here (fp32 head).
    settings : InflightSettings, optional
        The settings; ``None`` means ``InflightSettings()``.
    progress : bool, default False
        Show the scorers' progress bars.
    log : callable, default progress_log
        Called with one line per engine and arm.
    \*\*overrides
        Fields of :class:`InflightSettings`, replacing those of ``settings``.

    Returns
    -------
    dict of str to xarray.Dataset
        ``{arm: trace}`` (arms labelled ``keep-noclear-prefix_on`` ...), scored per version and
        with the latest weights, factors ``mode``, ``clear_cache``, ``prefix_caching``.

    Raises
    ------
    ValueError
        If ``modes`` is empty or holds an unknown mode, or ``update_after`` is not in (0, 1).
    FileNotFoundError
        If ``model`` or ``new_weights`` is not a local safetensors checkpoint.
    TypeError
        If an override is not a field of :class:`InflightSettings`.
    """
    from rlparity.capture.async_engine import AsyncEngine
    from rlparity.capture.pool import shared_pool
    from rlparity.capture.checkpoints import perturbed_checkpoint, safetensors_files
    from rlparity.experiments.ablation import shared_prefix_prompts
    from rlparity.score import Scorer, score_versions
    from rlparity.trace import concat_sequences, with_factors

    st = with_overrides(settings or InflightSettings(), overrides, "inflight_matrix")
    modes, clear_cache, prefix_caching = st.modes, st.clear_cache, st.prefix_caching
    sigma, seed, n_prompts, max_tokens, update_after = st.sigma, st.seed, st.n_prompts, st.max_tokens, st.update_after
    resubmit_aborted, dtype, device, batch_size = st.resubmit_aborted, st.dtype, st.device, st.batch_size
    modes = list(modes)
    bad = [m for m in modes if m not in PAUSE_MODES]
    if bad or not modes:
        raise ValueError(f"modes {modes}: use some of {', '.join(PAUSE_MODES)}")
    if not 0 < update_after < 1:
        raise ValueError(f"update_after={update_after}: the share of tokens before the update, in (0, 1)")
    v0 = Path(model)
    safetensors_files(v0)  # version 0 must be loadable back between arms: a local checkpoint
    if new_weights is None:
        out = Path(checkpoint_dir) if checkpoint_dir else v0.with_name(f"{v0.name}-inflight-v1")
        v1 = perturbed_checkpoint(v0, out, sigma=sigma, seed=seed)
        recipe = {"kind": "perturbation", "sigma": sigma, "seed": seed}
    else:
        v1 = Path(new_weights)
        safetensors_files(v1)
        recipe = {"kind": "checkpoint"}
    if prompts is None or after_prompts is None:
        both = shared_prefix_prompts(2 * n_prompts, seed=seed)
        prompts = list(prompts) if prompts is not None else both[:n_prompts]
        after_prompts = list(after_prompts) if after_prompts is not None else both[n_prompts:]
    sampling = sampling or default_sampling(max_tokens=max_tokens)
    scorers = dict(scorers or {})
    for v, path in ((0, v0), (1, v1)):
        if v not in scorers:
            scorers[v] = Scorer(str(path), dtype=dtype, head_dtype="float32", device=device, batch_size=batch_size,
                                progress=progress)
    shared_pool().close()
    warm = sampling.model_copy(update={"max_tokens": 1})
    threshold = max(1, int(update_after * len(prompts) * sampling.max_tokens))
    arms: dict[str, xr.Dataset] = {}
    for k, prefix in enumerate(prefix_caching):
        engine_settings = base_settings(dtype, enable_prefix_caching=bool(prefix)).replace(**dict(engine or {}))
        t0 = time.perf_counter()
        with AsyncEngine(str(v0), engine_settings) as eng:
            log(f"engine prefix_caching={prefix} started in {eng.startup_s:.1f} s")
            for i, (mode, clear) in enumerate(itertools.product(modes, clear_cache)):
                name = arm_name(mode, bool(clear), bool(prefix))
                if i:  # back to version 0 with a fresh cache
                    eng.update_weights(str(v0), 0, mode="wait", clear_cache=True)
                t_start = eng.clock()
                eng.capture(list(prompts), warm, arm=name)
                fut = eng.capture_async(list(prompts), sampling, arm=name, resubmit_aborted=resubmit_aborted)
                reached = eng.wait_tokens(threshold, timeout=600)
                update = eng.update_weights(str(v1), 1, mode=mode, clear_cache=bool(clear))
                inflight = fut.result(timeout=1200)
                after = eng.capture(list(after_prompts), sampling, arm=name)
                trace = with_factors(concat_sequences([inflight, after]), mode=mode, clear_cache=bool(clear),
                                     prefix_caching=bool(prefix))
                trace.attrs.update({
                    "arm": name, "latest_policy_version": 1,
                    "weight_updates": eng.weights.log(t_start, eng.clock()),
                    "inflight": {"mode": mode, "clear_cache": bool(clear), "prefix_caching": bool(prefix),
                                 "update": update, "update_after_tokens": threshold, "threshold_reached": reached,
                                 "n_inflight_prompts": len(prompts), "n_after_prompts": len(after_prompts),
                                 "resubmit_aborted": resubmit_aborted, "new_weights": recipe,
                                 "checkpoints": {"0": str(v0), "1": str(v1)},
                                 "engine": {"index": k, "startup_s": eng.startup_s}},
                })
                arms[name] = score_versions(trace, scorers, latest=1)
                log(f"  {name}: pause {update['pause_s']:.2f} s, {trace.sizes['sequence']} sequences")
        log(f"engine prefix_caching={prefix}: {time.perf_counter() - t0:.1f} s in all")
    return arms


def summarize(arms: Mapping[str, xr.Dataset], *, trainer: str | None = None) -> dict[str, Any]:
    """The numbers of an inflight run as plain data.

    Parameters
    ----------
    arms : Mapping of str to xarray.Dataset
        The arms of :func:`inflight_matrix`.
    trainer : str, optional
        The trainer reading to compare with; ``None``: the default of
        :func:`rlparity.metrics.inflight.inflight_table` and the diagnosis.

    Returns
    -------
    dict
        ``table`` (per arm), ``reset_ratios`` (kept over reset), ``flagged_stale_arms`` (the arms
        the diagnosis names with ``stale_prefix_cache_after_update``), ``lag_by_mode``,
        ``lag_histogram``, ``findings`` and ``verdict``.
    """
    from rlparity.diagnose import diagnose
    from rlparity.metrics import table_records
    from rlparity.metrics import inflight as mi

    table = mi.inflight_table(arms, trainer=trainer)
    report = diagnose(dict(arms), **({"trainer": trainer} if trainer else {}), title="inflight weight updates")
    flagged = sorted({f.arm for f in report if f.name == "stale_prefix_cache_after_update"
                      and f.severity.value == "error"})
    lag_by_mode = {}
    for m in PAUSE_MODES:
        sel = [a for a in table["arm"].values.tolist() if str(table["mode"].sel(arm=a).item()) == m]
        if sel:
            t = table.sel(arm=sel)
            lag_by_mode[m] = {k: float(t[k].mean()) for k in ("lag_mean", "offpolicy_share", "sequence_lag_mean",
                                                               "n_mixed_sequences", "n_aborted_sequences",
                                                               "aborted_tokens", "pause_s")}
    return {"table": table_records(table), "reset_ratios": mi.reset_ratios(table), "flagged_stale_arms": flagged,
            "lag_by_mode": lag_by_mode, "lag_histogram": table_records(mi.lag_histogram(arms)),
            "findings": report.to_dict()["findings"], "verdict": report.verdict}


__all__ = ["InflightSettings", "base_settings", "inflight_matrix", "summarize"]
