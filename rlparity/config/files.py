"""Reading the small YAML files users hand to rlparity (``RLPARITY_DEFAULTS``, engine profiles,
``rlparity check --thresholds``): one reader, so every such file fails the same way, in one line
that names the file, what is wrong and how to fix it (``ValueError``; ``FileNotFoundError`` when
the path does not exist). Only plain YAML is read (``yaml.safe_load``): a ``!!python`` tag is
refused, never executed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def read_yaml_mapping(path: str | os.PathLike, *, where: str, fix: str) -> dict[str, Any]:
    """The mapping a YAML file holds (``{}`` for an empty file); keys must be text.

    Parameters
    ----------
    path : str or os.PathLike
        The YAML file.
    where : str
        Starts every message (e.g. ``"RLPARITY_DEFAULTS=my.yaml"``).
    fix : str
        Ends every message: how to fix the file (e.g. ``"start from rlparity/data/check.yaml"``).

    Returns
    -------
    dict[str, Any]
        The file's mapping; ``{}`` for an empty file.

    Raises
    ------
    FileNotFoundError
        The path does not exist.
    ValueError
        The path is a folder, unreadable, not UTF-8, not plain YAML (a tag is refused), nested too
        deeply, not a mapping, or has a key that is not text.
    """
    import yaml

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{where}: no such file: {fix}")
    if p.is_dir():
        raise ValueError(f"{where}: is a folder, not a YAML file: {fix}")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{where}: cannot read it ({err.strerror or err}): {fix}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where}: is not UTF-8 text, so not a YAML file: {fix}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        what = (str(getattr(err, "problem", None) or err).splitlines() or [""])[0]
        kind = ("uses a YAML tag rlparity does not execute" if isinstance(err, yaml.constructor.ConstructorError)
                else "is not valid YAML")
        raise ValueError(f"{where}: {kind}{at} ({what}): write plain 'key: value' lines; {fix}") from None
    except RecursionError:
        raise ValueError(f"{where}: nests too deeply to be a settings file: {fix}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{where}: holds a YAML {type(data).__name__}, not a mapping of 'key: value' lines: {fix}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ValueError(f"{where}: key {bad[0]!r} is not a name (keys are text, such as 'tol'): {fix}")
    return data


__all__ = ["read_yaml_mapping"]
