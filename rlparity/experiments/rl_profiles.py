"""The RL run's profiles and the inputs of each step: the engine profiles (:func:`rl_profile`, the
derived ones of :data:`DERIVED_PROFILES`), the prompts and sampling of step k, the same for every
profile (:func:`step_prompts`, :func:`step_sampling`), and the runs' names (:func:`run_name`)."""

from __future__ import annotations

from typing import Any

from rlparity.config.defaults import RLDefaults, default_sampling
from rlparity.config.settings import EngineSettings, SamplingSettings

# derived profiles: name -> (built-in profile, changes)
DERIVED_PROFILES: dict[str, tuple[str, dict[str, Any]]] = {
    "parity-bf16-head": ("pipelinerl-parity", {"head_dtype": "bfloat16"}),
}
RL_PROFILES = tuple(RLDefaults().profiles)  # the built-in ones (RLPARITY_DEFAULTS is read when a run starts)


def rl_profile(name: str | EngineSettings) -> EngineSettings:
    """The :class:`~rlparity.config.settings.EngineSettings` of a profile of the RL run.

    Parameters
    ----------
    name : str or EngineSettings
        A built-in name or YAML path (:func:`rlparity.config.load_profile`), a derived profile of
        :data:`DERIVED_PROFILES` (``parity-bf16-head`` = ``pipelinerl-parity`` with
        ``head_dtype="bfloat16"``), or settings (returned as they are).

    Returns
    -------
    EngineSettings
        The profile's settings.

    Raises
    ------
    ValueError
        If the name is no profile (the message lists the derived ones too).
    """
    from rlparity.config.profiles import load_profile

    if isinstance(name, EngineSettings):
        return name
    if name in DERIVED_PROFILES:
        base, changes = DERIVED_PROFILES[name]
        return load_profile(base).replace(**changes)
    try:
        return load_profile(name)
    except ValueError as err:
        raise ValueError(f"{err}; derived profiles of the RL run: {', '.join(DERIVED_PROFILES)}") from None


def step_prompts(step: int, n_prompts: int, seed: int = 0) -> list[str]:
    """The prompts of step ``step``, the same for every profile.

    Parameters
    ----------
    step : int
        The step.
    n_prompts : int
        Prompts per step.
    seed : int, default 0
        The run's seed.

    Returns
    -------
    list of str
        :func:`rlparity.models.make_prompts` with seed ``seed * 100_003 + step``.
    """
    from rlparity.models import make_prompts

    return make_prompts(n_prompts, seed=seed * 100_003 + step)


def step_sampling(step: int, n_prompts: int, n_samples: int, max_tokens: int, seed: int = 0,
                  sampling: SamplingSettings | None = None) -> SamplingSettings:
    """The sampling of step ``step``, the same for every profile.

    Request i of the step uses seed base + i, so no two requests of a run share a seed.

    Parameters
    ----------
    step : int
        The step.
    n_prompts : int
        Prompts per step.
    n_samples : int
        Samples per prompt (``n``).
    max_tokens : int
        Tokens per sample.
    seed : int, default 0
        The run's seed.
    sampling : SamplingSettings, optional
        The base sampling; ``None`` means :func:`rlparity.config.default_sampling`.

    Returns
    -------
    SamplingSettings
        ``sampling`` with ``n``, ``max_tokens`` and base seed ``seed + step * n_prompts``.
    """
    base = sampling or default_sampling()
    return base.model_copy(update={"n": int(n_samples), "max_tokens": int(max_tokens),
                                   "seed": int(seed) + int(step) * int(n_prompts)})


OLD_POLICIES = ("pi_old", "mu")


def _profile_name(p: str | EngineSettings, i: int) -> str:
    return p if isinstance(p, str) else f"profile_{i}"


def run_name(profile: str, old_policy: str, several: bool) -> str:
    """The name of one run in the curves and the store.

    Parameters
    ----------
    profile : str
        The profile's name.
    old_policy : str
        The ratio denominator (``pi_old`` or ``mu``).
    several : bool
        Whether one call runs several ratio denominators.

    Returns
    -------
    str
        ``<profile>+<old_policy>`` (e.g. ``vllm-v1-defaults+mu``) when ``several``, else the profile's name.
    """
    return f"{profile}+{old_policy}" if several else profile
