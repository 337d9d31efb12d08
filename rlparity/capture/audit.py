"""Audit an engine's *effective* settings against a profile, with why each difference matters.

:func:`audit` takes a running :class:`~rlparity.capture.Engine`, a ``vllm.LLM``, a trace (its
``engine_effective`` attr), a vLLM / ``vllm serve`` / ``api_server`` command line, a YAML file
or mapping of engine kwargs, or a :class:`~rlparity.capture.server.Server`. Effective values are
read from the engine where one runs; for a command line or kwargs, vLLM resolves its own
defaults (``EngineArgs.create_engine_config``, no engine is started), so defaults that changed
between vLLM versions (prefix caching, async scheduling) are audited as this vLLM applies them.
The server path parses the command line with vLLM's own server parser: there
``--generation-config`` defaults to ``auto`` (sampling defaults from the model's
``generation_config.json``), which the audit reports with the defaults it would apply.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlparity.capture.engine_config import cpu_engine_kwargs, effective_config
from rlparity.config.profile_diff import WHY, AuditResult, Difference, audit_json, compare
from rlparity.config.settings import EngineSettings
from rlparity.trace import arm_record

# ------------------------------------------------------------------------------ sources
_SERVER_HEADS = (("vllm", "serve"), ("python", "-m", "vllm.entrypoints.openai.api_server"),
                 ("-m", "vllm.entrypoints.openai.api_server"), ("vllm.entrypoints.openai.api_server",))


def parse_command_line(command: str | list[str]) -> dict[str, Any]:
    """Engine kwargs of a ``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server`` command line.

    Parsed with vLLM's own server parser, so the server's defaults apply (``--generation-config``
    defaults to ``auto`` there). Leading ``ENV=1`` words are dropped; ``vllm serve MODEL`` and
    ``--model PATH`` both name the model.

    Parameters
    ----------
    command : str or list of str
        The command line, as one shell string or as its words.

    Returns
    -------
    dict
        ``{"__engine_args__": AsyncEngineArgs}``, which :func:`resolve_kwargs` accepts.

    Raises
    ------
    ValueError
        If the command line names no model, or vLLM's parser rejects it.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = shlex.split(command) if isinstance(command, str) else list(command)
    argv = [a for a in argv if not a.endswith("=1") or a.startswith("-")]  # drop leading ENV=1 words
    for head in _SERVER_HEADS:
        n = len(head)
        for i in range(len(argv) - n + 1):
            if tuple(Path(a).name if j == 0 and head[0] == "python" else a
                     for j, a in enumerate(argv[i:i + n])) == head or tuple(argv[i:i + n]) == head:
                argv = argv[i + n:]
                break
        else:
            continue
        break
    if argv and not argv[0].startswith("-"):  # `vllm serve MODEL ...`
        argv = ["--model", argv[0], *argv[1:]]
    if "--model" not in argv and not any(a.startswith("--model=") for a in argv):
        raise ValueError(f"no model in the command line {command!r}: pass MODEL or --model PATH")
    parser = make_arg_parser(FlexibleArgumentParser())
    try:
        ns = parser.parse_args(argv)
    except SystemExit as err:
        raise ValueError(f"vLLM cannot parse the command line {command!r} (see the message above)") from err
    args = AsyncEngineArgs.from_cli_args(ns)
    return {"__engine_args__": args}


def resolve_kwargs(kwargs: Mapping[str, Any] | Any) -> dict[str, Any]:
    """Effective configuration vLLM would run with for ``kwargs``, resolved without starting an engine.

    Parameters
    ----------
    kwargs : Mapping or vllm.engine.arg_utils.EngineArgs
        Engine kwargs (they must name ``model``; the CPU defaults of
        :func:`rlparity.capture.engine_config.cpu_engine_kwargs` fill in what they leave out), the
        result of :func:`parse_command_line`, or an ``EngineArgs`` object.

    Returns
    -------
    dict
        :func:`rlparity.capture.engine_config.effective_config` of
        ``EngineArgs.create_engine_config()``.

    Raises
    ------
    ValueError
        If the kwargs name no model or an argument vLLM does not know.
    """
    from vllm.engine.arg_utils import EngineArgs

    if isinstance(kwargs, Mapping) and "__engine_args__" in kwargs:
        args = kwargs["__engine_args__"]
    elif isinstance(kwargs, Mapping):
        kw = dict(kwargs)
        if "model" not in kw:
            raise ValueError("engine kwargs need 'model'")
        valid = set(EngineArgs.__dataclass_fields__)
        bad = [k for k in kw if k not in valid]
        if bad:
            raise ValueError(f"unknown vLLM engine argument(s) {bad}; see vllm.engine.arg_utils.EngineArgs")
        kw = {**cpu_engine_kwargs(EngineSettings()), **kw}
        args = EngineArgs(**kw)
    else:
        args = kwargs
    return effective_config(args.create_engine_config())


def effective_of(source: Any) -> tuple[dict[str, Any], str]:
    """The effective configuration of any audit source, with a description of the source.

    Parameters
    ----------
    source : object
        A trace (its ``engine_effective`` attr), an object with ``effective_config()`` (an
        rlparity engine or server client), a ``vllm.LLM``, a :class:`~rlparity.capture.server.Server`
        (its command line), a mapping of engine kwargs, a YAML/JSON file of engine kwargs or an
        rlparity profile, a trace store (``.zarr``: its first arm) or a vLLM command line.

    Returns
    -------
    tuple of (dict, str)
        ``(effective configuration, description of the source)``.

    Raises
    ------
    ValueError
        If a trace has no ``engine_effective`` attr, a file holds no mapping, or a string is
        none of the accepted sources.
    TypeError
        If ``source`` is of a type that cannot be audited.
    """
    import xarray as xr

    if isinstance(source, xr.Dataset):
        rec = arm_record(source)
        if not rec.engine_effective:
            raise ValueError("the trace has no 'engine_effective' attr: it was not captured by rlparity")
        return rec.engine_effective.to_attrs(), f"trace arm {rec.arm if rec.arm is not None else '?'!r}"
    if hasattr(source, "effective_config") and callable(source.effective_config):
        return dict(source.effective_config()), f"{type(source).__name__} {getattr(source, 'model', '')}".strip()
    if hasattr(source, "llm_engine"):  # vllm.LLM
        return effective_config(source.llm_engine.vllm_config), "vllm.LLM"
    if hasattr(source, "command_line") and callable(source.command_line):  # a Server
        return resolve_kwargs(parse_command_line(source.command_line())), "server command line"
    if isinstance(source, Mapping):
        return resolve_kwargs(source), "engine kwargs"
    if isinstance(source, (str, os.PathLike)):
        s = str(source)
        p = Path(s)
        if p.suffix in (".yaml", ".yml", ".json") and p.exists():
            import yaml

            data = yaml.safe_load(p.read_text())
            if isinstance(data, Mapping) and "settings" in data:  # an rlparity profile
                data = {**EngineSettings(**data["settings"]).to_engine_kwargs(),
                        **({"model": data["model"]} if "model" in data else {})}
            if not isinstance(data, Mapping):
                raise ValueError(f"{p}: expected a mapping of vLLM engine kwargs")
            return resolve_kwargs(data), f"kwargs file {p}"
        if p.suffix == ".zarr" or (p.is_dir() and (p / ".zgroup").exists()):
            from rlparity.trace import open_arms

            arms = open_arms(p)
            first = next(iter(arms.values()))
            return effective_of(first)[0], f"trace {p} arm {arm_record(first).arm!r}"
        if " " in s or s.startswith("--") or s.startswith("vllm"):
            return resolve_kwargs(parse_command_line(s)), "command line"
        raise ValueError(f"cannot audit {s!r}: pass an Engine, a vllm.LLM, a trace, a YAML/JSON file of "
                         "engine kwargs or a vLLM command line")
    raise TypeError(f"cannot audit a {type(source).__name__}: pass an Engine, a vllm.LLM, a trace, a "
                    "command line, a kwargs mapping/YAML or a Server")


def audit(source: Any, profile: str | os.PathLike | EngineSettings | None = None) -> AuditResult:
    """Audit ``source``'s effective settings against a profile.

    Parameters
    ----------
    source : object
        Anything :func:`effective_of` accepts (an engine, a ``vllm.LLM``, a trace, a command line,
        engine kwargs or a file of them, a server).
    profile : str, os.PathLike or EngineSettings, optional
        A profile name, a profile file or settings; ``None`` means the reference profile of
        :func:`rlparity.config.defaults` (``pipelinerl-parity``).

    Returns
    -------
    AuditResult
        The differences between the effective settings and the profile, each with why it matters.
    """
    eff, desc = effective_of(source)
    return compare(eff, profile, source=desc)


__all__ = ["WHY", "AuditResult", "Difference", "audit", "audit_json", "compare", "effective_of",
           "parse_command_line", "resolve_kwargs"]
