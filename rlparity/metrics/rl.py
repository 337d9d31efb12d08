"""The curves of an online RL run: one row of numbers per (profile, step), from the kept traces.

:func:`rlparity.experiments.rl.rl_run` keeps every step's rollout trace in one store, arms labelled
``<run>@step_003`` (:func:`step_arm`; a run is an engine profile, ``pipelinerl-parity``, or a
profile and the loss's ratio denominator, ``pipelinerl-parity+mu``) with the factors ``profile``,
``old_policy`` and ``step`` in their attrs (:func:`rlparity.trace.arm_factors`, read by
:func:`run_steps`; the label is never parsed); each trace holds the rollout (mu = ``rollout_logprob``),
pi_old (the trainer at the weights that sampled each token), pi_theta (after the step),
``reward`` and ``advantage`` (written by :func:`rlparity.train.train_step`), every token's
``policy_version`` and, in ``attrs["rl"]``, what the runner did and how long it took. Everything
here reads those traces alone, so any stored run can be redrawn or any step diagnosed later.

:func:`step_metrics` gives one step's numbers, :func:`rl_curves` the ``(profile, step)`` Dataset
(``profile`` = the run; coordinates ``engine_profile`` and ``old_policy`` along it);
:func:`profile_contrast` compares each run with the reference profile's run of the same ratio
denominator.

Pairs and directions (nats, ``d = log numerator - log denominator``):

* PipelineRL's names (:func:`rlparity.metrics.dashboard.pipelinerl_metrics`, its own formulas)
  on the **backend pair** (pi_old, mu), pi_old read at each token's own version:
  ``kl_new_old``, ``ratio_new_old``, ``clamp_log_ratio_new_old_indicator`` (token clip for
  PPO / GRPO, GSPO's sequence clip for GSPO), ``ess``;
* ``mean_ratio``: token mean of pi_old/mu (the backend pair, rlparity's objective layer);
* ``kl_new_old_latest``: PipelineRL's ``kl_new_old`` with the trainer at the step's weights for
  every token (what PipelineRL logs when rollouts lag: policy change folded in);
* ``kl_update``: the same formula on the **update pair** (pi_theta, pi_old): the step's size.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.provenance import make_attrs
from rlparity.metrics import objective as mo
from rlparity.metrics.dashboard.peers import pipelinerl_metrics
from rlparity.metrics.inflight import lag_summary
from rlparity.metrics.summary import trainer_side
from rlparity.trace import arm_factors, arm_record, as_arms

STEP_WIDTH = 3
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=,-]*$")  # checks a profile name; parses nothing
STEP_FACTORS = ("profile", "old_policy", "step")
ENTROPY_VARIABLE = {"processed": "trainer_processed_entropy", "raw": "trainer_entropy"}
LATEST_VARIABLE = {"processed": "trainer_latest_processed_logprob", "raw": "trainer_latest_logprob"}

# variable -> (long name, units, pair or source)
CURVE_VARIABLES: dict[str, tuple[str, str, str]] = {
    "reward": ("mean reward of the batch (arithmetic checker)", "1", "reward"),
    "kl_new_old": ("PipelineRL rl/kl_new_old: sequence mean of token means of exp(d) - d - 1", "nats", "backend"),
    "clamp_log_ratio_new_old_indicator": (("PipelineRL rl/clamp_log_ratio_new_old_indicator: clamped share "
                                           "(token clip for ppo/grpo, GSPO sequence clip for gspo)"), "1", "backend"),
    "ratio_new_old": ("PipelineRL rl/ratio_new_old: sequence mean of token means of exp(d)", "1", "backend"),
    "mean_ratio": ("token mean of pi_old/mu", "1", "backend"),
    "ess": ("PipelineRL rl/ess: (sum rho)^2 / (n sum rho^2), raw token weights", "1", "backend"),
    "entropy": ("mean entropy of the trainer's distribution at the sampled positions", "nats", "pi_old"),
    "kl_update": ("PipelineRL's kl_new_old on the update pair: the optimizer step's size", "nats", "update"),
    "kl_new_old_latest": (("PipelineRL rl/kl_new_old with the trainer at the step's weights for every token "
                           "(policy lag folded in)"), "nats", "latest"),
    "lag": ("mean policy lag: trainer version - version that sampled the token", "versions", "lag"),
    "offpolicy_share": ("share of tokens sampled by older weights than the trainer's", "1", "lag"),
    "masked_fraction": ("share of usable tokens the token band rule [1/C, C] would reject", "1", "backend"),
    "excluded_fraction": ("share of response tokens a side gives probability 0 (left out of every ratio)", "1",
                          "backend"),
    "response_length": ("mean response length", "tokens", "rollout"),
    "rollout_s": ("seconds from asking for the batch to having it (waiting on the async rollout)", "s", "time"),
    "train_s": ("seconds of the trainer: rescoring pi_old and the optimizer step", "s", "time"),
    "update_s": ("seconds to save the weights and push them into the engine (pause to resume)", "s", "time"),
    "wall_s": ("seconds of the whole step", "s", "time"),
}
PAIR_NAMES = {"backend": "backend (pi_old, mu)", "update": "update (pi_theta, pi_old)",
              "latest": "latest (pi_latest, mu)"}


def step_arm(profile: str, step: int) -> str:
    """``pipelinerl-parity@step_003``: the label of one step of one run (a valid store arm name: no
    ``/``; the run name may not contain ``@``).

    Parameters
    ----------
    profile : str
        The run's name (letters, digits and ``_ . + = , -``).
    step : int
        The step, from 0.

    Returns
    -------
    str
    """
    if not _PROFILE_NAME.match(str(profile)):
        raise ValueError(f"profile name {profile!r} cannot name an arm: use letters, digits and _ . + = , - "
                         "(no '/' or '@'), starting with a letter, digit or _")
    if int(step) < 0:
        raise ValueError(f"step {step} is negative: steps count from 0")
    return f"{profile}@step_{int(step):0{STEP_WIDTH}d}"


def is_rl_run(arms) -> bool:
    """Whether every arm of ``arms`` is a step of an RL run (records the factors ``profile``,
    ``old_policy``, ``step``).

    Parameters
    ----------
    arms : mapping
        ``{arm: trace}`` (or what :func:`rlparity.trace.as_arms` takes).

    Returns
    -------
    bool
    """
    arms = as_arms(arms)
    return bool(arms) and all(set(STEP_FACTORS) <= set(arm_factors(ds)) for ds in arms.values())


def run_steps(arms) -> dict[str, tuple[str, int]]:
    """``{arm: (run, step)}`` of an RL run's arms, from their factors: the run is what the runner
    recorded (``attrs["rl"]["run"]``), else ``<profile>+<old_policy>`` where the arms hold several
    ratio denominators, else the profile. An arm that is no RL step is an error.

    Parameters
    ----------
    arms : mapping
        ``{arm: trace}`` (or what :func:`rlparity.trace.as_arms` takes).

    Returns
    -------
    dict[str, tuple[str, int]]
    """
    arms = as_arms(arms)
    f = {}
    for a, ds in arms.items():
        f[a] = arm_factors(ds)
        if not set(STEP_FACTORS) <= set(f[a]):
            raise ValueError(f"arm {a!r} is not an RL step: it records no factors profile, old_policy, step "
                             "(capture it with rlparity.experiments.rl.rl_run)")
    several = len({x["old_policy"] for x in f.values()}) > 1
    out = {}
    for a, ds in arms.items():
        run = (arm_record(ds).rl or {}).get("run")
        if not run:
            run = f"{f[a]['profile']}+{f[a]['old_policy']}" if several else str(f[a]["profile"])
        out[a] = (str(run), int(f[a]["step"]))
    return out


def steps_as_arms(runs: Mapping[str, Mapping[int, xr.Dataset]], *, old_policy: str = "not recorded"
                  ) -> dict[str, xr.Dataset]:
    """``{run: {step: trace}}`` (a run store's steps, ``rlparity.cli.doctor.read_runs``) as RL step
    arms ``<run>@step_NNN`` that :func:`rlparity.trace.save` can store and :func:`run_steps` reads
    back to the same runs and steps: the inverse of grouping by :func:`run_steps`.

    Each trace is a copy with the factors ``profile`` (the run), ``old_policy`` and ``step``, and
    its attrs made strict JSON (a NaN metric, e.g. a reward the loop did not give, becomes null).

    Parameters
    ----------
    runs : Mapping[str, Mapping[int, xarray.Dataset]]
        Per run, its steps.
    old_policy : str, default "not recorded"
        The factor ``old_policy`` where a trace's attrs do not name it.

    Returns
    -------
    dict[str, xarray.Dataset]
        ``{step_arm(run, step): trace}``, runs in order, steps ascending.
    """
    from rlparity.config.provenance import jsonable
    from rlparity.trace import with_factors

    out: dict[str, xr.Dataset] = {}
    for run, steps in runs.items():
        for k in sorted(steps):
            ds = steps[k].copy()
            ds.attrs = jsonable(dict(ds.attrs), strict=True)
            ds.attrs["rl"] = {**(ds.attrs.get("rl") or {}), "run": str(run), "step": int(k)}
            with_factors(ds, profile=str(run), old_policy=str(ds.attrs.get("old_policy") or old_policy), step=int(k))
            out[step_arm(str(run), int(k))] = ds
    return out


def _mean(x: np.ndarray, m: np.ndarray) -> float:
    return float(x[m].mean()) if m.any() else float("nan")


def _clip_level(loss: str) -> str:
    return "gspo" if loss == "gspo" else "ppo"


def step_metrics(trace: xr.Dataset, *, loss: str | None = None, trainer: TrainerSide | None = None) -> dict[str, float]:
    """One step's numbers (the keys of :data:`CURVE_VARIABLES`) from its kept trace.

    ``loss`` picks the clip of ``clamp_log_ratio_new_old_indicator`` (default the run's,
    ``attrs["rl"]["loss"]``: GSPO's sequence clip for ``gspo``, the PPO token clip otherwise;
    thresholds from :func:`rlparity.config.defaults`); ``trainer`` the reading pi_old is (default
    :func:`rlparity.metrics.trainer_side`). A metric the trace cannot give (no pi_theta, no
    ``reward``, no timings) is NaN. A step's numbers are what a trainer logs once per step, a
    function of the whole arm, so there is no ``dim=`` (per token: :func:`rlparity.metrics.summary`
    or the objective metrics with ``dim=``).

    Parameters
    ----------
    trace : xarray.Dataset
        One step's kept trace.
    loss : str, optional
        The loss (default the run's, ``attrs["rl"]["loss"]``).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    dict[str, float]
    """
    rec = arm_record(trace).rl or {}
    loss = loss or rec.get("loss") or defaults().rl.loss
    side = trainer_side(trace, trainer)
    mask = trace["response_mask"].values.astype(bool)
    mu = mo.policy_logprob(trace, "mu", side)
    old = mo.policy_logprob(trace, "old", side)
    out: dict[str, float] = dict.fromkeys(CURVE_VARIABLES, float("nan"))
    pl = pipelinerl_metrics(old, mu, mask, policy_loss=_clip_level(loss))
    out.update({k: pl[f"rl/{k}"] for k in ("kl_new_old", "clamp_log_ratio_new_old_indicator", "ratio_new_old",
                                           "ess")})
    d = mo.logprob_difference(old, mu, mask)
    u = mo.finite_tokens(d, mask)
    out["mean_ratio"] = mo.token_mean(np.exp(np.where(u, d, 0.0)), d, mask).value
    keep = mo.rejection_keep(d, mask, rule="token_band", threshold=mo.OBJECTIVE_DEFAULTS.band("token_band"))
    out["masked_fraction"] = mo.rejected_fraction(keep, d, mask).value
    out["excluded_fraction"] = float((mask & ~u).sum() / max(int(mask.sum()), 1))
    ent = ENTROPY_VARIABLE[side]
    if ent in trace:
        out["entropy"] = _mean(trace[ent].values, mask & np.isfinite(trace[ent].values))
    if "reward" in trace:
        out["reward"] = float(np.nanmean(trace["reward"].values))
    if mo.policy_variable("theta", side) in trace:
        theta = mo.policy_logprob(trace, "theta", side)
        out["kl_update"] = pipelinerl_metrics(theta, old, mask)["rl/kl_new_old"]
    if LATEST_VARIABLE[side] in trace:
        out["kl_new_old_latest"] = pipelinerl_metrics(trace[LATEST_VARIABLE[side]].values, mu, mask)["rl/kl_new_old"]
    if "policy_version" in trace:
        lag = lag_summary(trace)
        out["lag"], out["offpolicy_share"] = float(lag["lag_mean"]), float(lag["offpolicy_share"])
    out["response_length"] = float(trace["response_length"].values.mean())
    secs = rec.get("seconds") or {}
    for k in ("rollout", "train", "update", "wall"):
        if secs.get(k) is not None:
            out[f"{k}_s"] = float(secs[k])
    return out


def rl_curves(arms, *, loss: str | None = None, trainer: TrainerSide | None = None,
              profiles: Sequence[str] | None = None) -> xr.Dataset:
    """The run's curves: one variable per metric of :data:`CURVE_VARIABLES`, dims ``(profile, step)``.

    ``arms``: ``{"<profile>@step_NNN": trace}`` (what :func:`rlparity.experiments.rl.rl_run`
    returns, or :func:`rlparity.trace.open_arms` of its store). Profiles keep the order the run
    gave them (``attrs["rl"]["profile_index"]``), else their first appearance; ``profiles`` selects
    and orders them. A step a profile lacks is NaN. Each variable's attrs name its pair, direction
    and units.

    Parameters
    ----------
    arms : mapping
        ``{arm: trace}`` (or what :func:`rlparity.trace.as_arms` takes).
    loss : str, optional
        The loss (default the run's, ``attrs["rl"]["loss"]``).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    profiles : sequence of str, optional
        The runs kept (default all).

    Returns
    -------
    xarray.Dataset
    """
    arms = as_arms(arms)
    if not arms:
        raise ValueError("no traces: pass {'<profile>@step_NNN': trace} as rl_run returns it")
    cells: dict[tuple[str, int], xr.Dataset] = {}
    order: dict[str, float] = {}
    info: dict[str, tuple[str, str]] = {}
    for name, (prof, step) in run_steps(arms).items():
        ds = arms[name]
        cells[(prof, step)] = ds
        idx = (arm_record(ds).rl or {}).get("profile_index")
        order.setdefault(prof, float(idx) if idx is not None else len(order) + 1e6)
        f = arm_factors(ds)
        info.setdefault(prof, (str(f["profile"]), str(f["old_policy"])))
    names = sorted(order, key=lambda p: order[p])
    if profiles is not None:
        missing = [p for p in profiles if p not in order]
        if missing:
            raise ValueError(f"profile(s) {missing} are not in the run; it holds {names}")
        names = list(profiles)
    steps = sorted({s for (_, s) in cells})
    data = {k: np.full((len(names), len(steps)), np.nan) for k in CURVE_VARIABLES}
    losses = set()
    for (prof, step), ds in cells.items():
        if prof not in names:
            continue
        row = step_metrics(ds, loss=loss, trainer=trainer)
        losses.add(loss or (arm_record(ds).rl or {}).get("loss") or defaults().rl.loss)
        for k, v in row.items():
            data[k][names.index(prof), steps.index(step)] = v
    side = trainer_side(next(iter(cells.values())), trainer)
    ds = xr.Dataset(coords={"profile": names, "step": np.asarray(steps, dtype=np.int64),
                            "engine_profile": ("profile", [info[p][0] for p in names]),
                            "old_policy": ("profile", [info[p][1] for p in names])})
    for k, (long, units, pair) in CURVE_VARIABLES.items():
        attrs = {"long_name": long, "units": units}
        if pair in PAIR_NAMES:
            num = {"backend": f"pi_old ({mo.policy_variable('old', side)})",
                   "update": f"pi_theta ({mo.policy_variable('theta', side)})",
                   "latest": f"pi_latest ({LATEST_VARIABLE[side]})"}[pair]
            den = "pi_old" if pair == "update" else "mu (rollout_logprob)"
            attrs.update({"pair": PAIR_NAMES[pair], "direction": f"d = log {num} - log {den}"})
        if k == "entropy":
            attrs["variable"] = f"{ENTROPY_VARIABLE[side]} (the {side} reading, pi_old's weights)"
        ds[k] = (("profile", "step"), data[k], attrs)
    ds["step"].attrs = {"long_name": "optimizer step (the batch trained at that step)"}
    ds["engine_profile"].attrs = {"long_name": "the engine profile of the run"}
    ds["old_policy"].attrs = {"long_name": "the loss's ratio denominator: pi_old (recomputed by the trainer) or mu "
                                           "(the engine's logprobs)"}
    ds.attrs = make_attrs(trainer_side=side, loss=",".join(sorted(losses)),
                          clip=("GSPO sequence clip" if losses == {"gspo"} else "PPO token clip"),
                          source="rlparity.metrics.rl.rl_curves")
    return ds


def profile_contrast(curves: xr.Dataset, reference: str | None = None) -> dict[str, dict[str, Any]]:
    """Each run against the reference profile's run with the same ratio denominator
    (``old_policy``), over the run's steps: the largest ``|mean_ratio - 1|``, the clamp indicator
    (step 0, mean, and its ratio to the reference's: ``inf`` when the reference clipped nothing),
    the reward (mean, first to last) and its gap to the reference (mean and last step, run minus
    reference). ``reference``: an engine profile (default the first run's).

    Parameters
    ----------
    curves : xarray.Dataset
        :func:`rl_curves`.
    reference : str, optional
        An engine profile (default the first run's).

    Returns
    -------
    dict[str, dict[str, Any]]
    """
    runs = curves["profile"].values.tolist()
    engine = dict(zip(runs, curves["engine_profile"].values.tolist()))
    old = dict(zip(runs, curves["old_policy"].values.tolist()))
    reference = reference or engine[runs[0]]
    refs = {old[r]: r for r in runs if engine[r] == reference}
    if not refs:
        raise ValueError(f"reference {reference!r} is not a profile of the curves: {sorted(set(engine.values()))}")
    out: dict[str, dict[str, Any]] = {}
    for p in runs:
        if old[p] not in refs:
            continue
        ref = curves.sel(profile=refs[old[p]])
        ref_clip = float(ref["clamp_log_ratio_new_old_indicator"].mean())
        c = curves.sel(profile=p)
        clip = float(c["clamp_log_ratio_new_old_indicator"].mean())
        first = c.isel(step=0)
        out[p] = {
            "engine_profile": engine[p], "old_policy": old[p], "reference_run": refs[old[p]],
            "max_abs_mean_ratio_minus_1": float(np.abs(c["mean_ratio"] - 1).max()),
            "mean_ratio_step0": float(first["mean_ratio"]),
            "clamp_indicator_step0": float(first["clamp_log_ratio_new_old_indicator"]),
            "clamp_indicator_mean": clip,
            "clamp_indicator_vs_reference": (clip / ref_clip if ref_clip > 0 else
                                             (float("inf") if clip > 0 else 1.0)),
            "kl_new_old_mean": float(c["kl_new_old"].mean()),
            "entropy_last": float(c["entropy"].isel(step=-1)),
            "reward_mean": float(c["reward"].mean()),
            "reward_first_to_last": float(c["reward"].isel(step=-1) - c["reward"].isel(step=0)),
            "reward_gap_mean": float((c["reward"] - ref["reward"]).mean()),
            "reward_gap_last": float(c["reward"].isel(step=-1) - ref["reward"].isel(step=-1)),
        }
    return out


def curves_records(curves: xr.Dataset) -> dict[str, Any]:
    """The curves as plain data for JSON: ``{"steps": [...], "profiles": {run: {var: [...]}},
    "runs": {run: {"engine_profile", "old_policy"}}, "variables": {var: attrs}}`` (NaN stays NaN;
    write with :func:`rlparity.config.provenance.write_json`).

    Parameters
    ----------
    curves : xarray.Dataset
        :func:`rl_curves`.

    Returns
    -------
    dict[str, Any]
    """
    runs = curves["profile"].values.tolist()
    return {
        "steps": curves["step"].values.tolist(),
        "runs": {r: {k: str(curves[k].sel(profile=r).item()) for k in ("engine_profile", "old_policy")
                     if k in curves.coords} for r in runs},
        "profiles": {p: {k: curves[k].sel(profile=p).values.tolist() for k in curves.data_vars}
                     for p in curves["profile"].values.tolist()},
        "variables": {k: dict(curves[k].attrs) for k in curves.data_vars},
        "attrs": dict(curves.attrs),
    }


def curves_from_records(records: Mapping[str, Any]) -> xr.Dataset:
    """The curves Dataset back from :func:`curves_records` (as stored in JSON or in a store's attrs,
    e.g. the shipped ``h200-rl`` example: ``example_attrs("h200-rl")["rl_curves"]``); ``None``
    values read as NaN. A run without its ``runs`` entry (a record older than them) is its own
    engine profile.

    Parameters
    ----------
    records : mapping
        What :func:`curves_records` wrote.

    Returns
    -------
    xarray.Dataset
    """
    try:
        runs = list(records["profiles"])
        steps = np.asarray(records["steps"], dtype=np.int64)
        variables = records.get("variables") or {}
    except (KeyError, TypeError) as err:
        raise ValueError(f"not a curves record ({err}): pass what rlparity.metrics.rl.curves_records returned") from err
    meta = records.get("runs") or {}
    ds = xr.Dataset(coords={"profile": runs, "step": steps,
                            "engine_profile": ("profile", [meta.get(r, {}).get("engine_profile", r)
                                                           for r in runs]),
                            "old_policy": ("profile", [meta.get(r, {}).get("old_policy", "") for r in runs])})
    names = list(dict.fromkeys(k for r in runs for k in records["profiles"][r]))
    for k in names:
        rows = [[np.nan if v is None else float(v) for v in records["profiles"][r].get(k, [None] * len(steps))]
                for r in runs]
        ds[k] = (("profile", "step"), np.asarray(rows, dtype=float), dict(variables.get(k, {})))
    ds.attrs = dict(records.get("attrs") or {})
    return ds


__all__ = ["CURVE_VARIABLES", "PAIR_NAMES", "STEP_FACTORS", "curves_from_records", "curves_records", "is_rl_run",
           "profile_contrast", "rl_curves", "run_steps", "step_arm", "step_metrics", "steps_as_arms"]
