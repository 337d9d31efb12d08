"""Named engine profiles: :class:`~rlparity.config.settings.EngineSettings` stored as YAML.

A profile file holds ``settings:`` (fields of :class:`~rlparity.config.settings.EngineSettings`) and optionally
``description:``; a bare mapping of settings is accepted too. Built-in profiles live in
``rlparity/data/profiles/*.yaml``: ``vllm-v1-defaults`` (nothing set) and ``pipelinerl-parity``
(processed logprobs, prefix caching off, async scheduling off, fp32 LM head,
``generation_config: vllm``). Users pass a built-in name or the path of their own YAML.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from rlparity.config.files import read_yaml_mapping
from rlparity.config.settings import EngineSettings

PROFILE_DIR = Path(__file__).resolve().parent.parent / "data" / "profiles"
_TOP_KEYS = {"settings", "description"}


def profile_names() -> list[str]:
    """Names of the built-in profiles.

    Returns
    -------
    list[str]
        The stems of ``rlparity/data/profiles/*.yaml``, sorted.
    """
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def _path(name_or_path: str | os.PathLike) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise FileNotFoundError(f"profile file {p} does not exist")
        return p
    builtin = PROFILE_DIR / f"{name_or_path}.yaml"
    if not builtin.exists():
        raise ValueError(f"unknown profile {str(name_or_path)!r}; built-in profiles: "
                         f"{', '.join(profile_names())} (or pass the path of a YAML file)")
    return builtin


def settings_from_mapping(data: dict[str, Any], *, where: str = "profile") -> EngineSettings:
    """:class:`~rlparity.config.settings.EngineSettings` from a mapping; an unknown key is an error naming the valid ones.

    Parameters
    ----------
    data : dict[str, Any]
        Engine settings by field name.
    where : str, default "profile"
        What the mapping came from, for the error message.

    Returns
    -------
    EngineSettings
        The validated settings.

    Raises
    ------
    ValueError
        ``data`` is not a mapping, or has a key that is no setting.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of engine settings, got {type(data).__name__}")
    valid = list(EngineSettings.model_fields)
    unknown = [k for k in data if k not in valid]
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(map(repr, unknown))}; valid settings: "
                         f"{', '.join(valid)}")
    return EngineSettings(**data)


def read_profile(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """A profile with its name, description and path.

    Parameters
    ----------
    name_or_path : str or os.PathLike
        A built-in profile name or the path of a YAML file.

    Returns
    -------
    dict[str, Any]
        ``name`` (the file's stem), ``description``, ``path`` and ``settings`` (an
        :class:`~rlparity.config.settings.EngineSettings`).

    Raises
    ------
    FileNotFoundError
        A ``.yaml`` path that does not exist.
    ValueError
        An unknown profile name, a file that is no YAML mapping, an unknown top-level key or setting.
    """
    path = _path(name_or_path)
    data = read_yaml_mapping(path, where=f"profile {path}", fix="a profile holds 'settings:' (engine settings) "
                             "and 'description:'; `rlparity profiles pipelinerl-parity` prints one")
    if "settings" in data:
        extra = [k for k in data if k not in _TOP_KEYS]
        if extra:
            raise ValueError(f"{path}: unknown top-level key(s) {', '.join(map(repr, extra))}; "
                             f"valid: {', '.join(sorted(_TOP_KEYS))}")
        settings = {} if data["settings"] is None else data["settings"]
        desc = str(data.get("description", ""))
    else:
        settings, desc = data, ""
    return {"name": path.stem, "description": desc, "path": str(path),
            "settings": settings_from_mapping(settings, where=str(path))}


def load_profile(name_or_path: str | os.PathLike | EngineSettings | None = None) -> EngineSettings:
    """The :class:`~rlparity.config.settings.EngineSettings` of a built-in profile name or a YAML file.

    Parameters
    ----------
    name_or_path : str, os.PathLike, EngineSettings or None, optional
        A built-in profile name, a YAML path, or settings (returned as they are); ``None`` is the
        reference profile of :func:`rlparity.config.defaults`.

    Returns
    -------
    EngineSettings
        The profile's settings.
    """
    if isinstance(name_or_path, EngineSettings):
        return name_or_path
    if name_or_path is None:
        from rlparity.config.defaults import defaults

        name_or_path = defaults().profile
    return read_profile(name_or_path)["settings"]


# what every experiment's reference engine takes from the reference profile: its reading of the logprobs and its head
REFERENCE_READING = ("logprobs_mode", "head_dtype", "generation_config")


def reference_engine(**changes: Any) -> EngineSettings:
    """The reference engine of an experiment: the ``pipelinerl-parity`` profile's reading (processed
    logprobs, the fp32 LM head, vLLM's own sampling defaults: :data:`REFERENCE_READING`) with the
    experiment's own settings (``dtype``, and prefix caching or eager mode where they are its
    factors; the profile's other settings are left to the engine unless given).

    Parameters
    ----------
    **changes
        Fields of :class:`~rlparity.config.settings.EngineSettings`; they win over the profile's.

    Returns
    -------
    EngineSettings
    """
    profile = load_profile("pipelinerl-parity")
    return EngineSettings(**{**{k: getattr(profile, k) for k in REFERENCE_READING}, **changes})


def save_profile(settings: EngineSettings, path: str | os.PathLike, description: str = "") -> Path:
    """Write ``settings`` as a profile YAML (only the fields that differ from ``EngineSettings()``).

    Parameters
    ----------
    settings : EngineSettings
        The settings to store.
    path : str or os.PathLike
        The YAML file to write.
    description : str, default ""
        The profile's ``description:``.

    Returns
    -------
    Path
        ``path``.
    """
    base = EngineSettings().model_dump()
    diff = {k: v for k, v in settings.model_dump().items() if v != base[k]}
    path = Path(path)
    path.write_text(yaml.safe_dump({"description": description, "settings": diff}, sort_keys=False))
    return path


__all__ = ["PROFILE_DIR", "REFERENCE_READING", "load_profile", "profile_names", "read_profile", "reference_engine",
           "save_profile", "settings_from_mapping"]
