"""Helpers the commands share: engine settings from flags, prompt files, arm selection, output."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from rlparity.cli.contract import BadInput


class TrainerSide(str, Enum):
    """Which trainer reading the rollout must match (a closed choice on the command line)."""

    processed = "processed"
    raw = "raw"


def json_object(text: str, flag: str, what: str, example: str) -> dict[str, Any]:
    """A JSON object given on the command line; anything else is a :class:`~rlparity.cli.contract.BadInput` with an example."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadInput(f"{flag} is not JSON ({err.msg} at character {err.pos}): pass an object such as "
                       f"'{example}'") from None
    if not isinstance(value, dict):
        raise BadInput(f"{flag} must be a JSON object of {what}, got {type(value).__name__} {text!r}: e.g. '{example}'")
    return value


def trainer_settings(trainer_json: str | None):
    """:class:`~rlparity.config.settings.TrainerSettings` from ``--trainer JSON`` (how the trainer computes:
    e.g. routing replay, its MoE routers' dtype); a bad value is a :class:`~rlparity.cli.contract.BadInput` naming the field."""
    from pydantic import ValidationError

    from rlparity.config.settings import TrainerSettings

    if not trainer_json:
        return None
    data = json_object(trainer_json, "--trainer", "trainer settings", '{"routing_replay": "also"}')
    try:
        return TrainerSettings(**data)
    except ValidationError as err:
        raise BadInput("trainer settings (--trainer): " + validation_message(err, flags=False)
                       + f" (valid keys: {', '.join(TrainerSettings.model_fields)})") from None


def engine_settings(engine_json: str | None, profile: str | None):
    """:class:`~rlparity.config.EngineSettings` from ``--profile`` and ``--engine JSON`` (the JSON
    overrides the profile); a bad value is a :class:`~rlparity.cli.contract.BadInput` naming the field."""
    from pydantic import ValidationError

    from rlparity.config import EngineSettings, load_profile

    base: dict[str, Any] = {}
    if profile:
        base = load_profile(profile).model_dump()
    if engine_json:
        base.update(json_object(engine_json, "--engine", "engine settings", '{"logprobs_mode": "processed_logprobs"}'))
    try:
        return EngineSettings(**base)
    except ValidationError as err:
        raise BadInput("engine settings (--engine / --profile): " + validation_message(err, flags=False)
                       + f" (valid keys: {', '.join(EngineSettings.model_fields)})") from None


def sampling_settings(**values: Any):
    """:class:`~rlparity.config.SamplingSettings` from flags; a bad value names the field and range."""
    from pydantic import ValidationError

    from rlparity.config import SamplingSettings

    try:
        return SamplingSettings(**values)
    except ValidationError as err:
        raise BadInput("sampling: " + validation_message(err)) from None


def validation_message(err, *, flags: bool = True) -> str:
    """One line from a pydantic ``ValidationError``: ``--field: problem (got value)`` per error
    (``flags=False``: the field's own name, for keys of a JSON or YAML mapping)."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e.get("loc", ())) or "(value)"
        name = f"--{loc.replace('_', '-')}" if flags else repr(loc)
        parts.append(f"{name}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(parts)


def read_prompts(path: Path | None, num: int, seed: int) -> list:
    """Prompts from a text file (one per line) or JSONL (``prompt`` / ``prompt_token_ids`` /
    ``messages``); the built-in arithmetic prompts without a file."""
    from rlparity.models import make_prompts

    if path is None:
        return make_prompts(num, seed=seed)
    if not path.exists():
        raise BadInput(f"--prompts {path}: no such file")
    text = path.read_text()
    if path.suffix == ".jsonl":
        out = []
        for i, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise BadInput(f"{path}:{i}: not JSON ({err.msg}); each line must be an object with "
                                   "'prompt', 'prompt_token_ids' or 'messages'") from None
        return out
    return [line for line in text.splitlines() if line.strip()]


def select_arms(arms: Mapping[str, Any], wanted: Sequence[str] | None, store: Path) -> dict[str, Any]:
    """The arms named in ``--arm`` (all without it); an unknown name is a :class:`~rlparity.cli.contract.BadInput`."""
    if not wanted:
        return dict(arms)
    unknown = sorted(set(wanted) - set(arms))
    if unknown:
        raise BadInput(f"no arm(s) {unknown} in {store}; it holds {sorted(arms)}")
    return {k: v for k, v in arms.items() if k in wanted}


def output_store(out: Path, flag: str = "--out") -> Path:
    """``out`` if a store may be written there, checked before any model loads or engine starts:
    missing, an empty folder or an rlparity store; '.', '..', '/', the working directory, a file or
    a folder of other files is a :class:`~rlparity.cli.contract.BadInput` naming the flag."""
    from rlparity.trace.storage import StoreError, check_target

    try:
        check_target(out, overwrite=True)
    except StoreError as err:
        raise BadInput(f"{flag} {out}: {err}") from None
    return out


# ----------------------------------------------------------------------------- arguments, checked first
# Every rule below runs before a model is built or an engine starts (typer callbacks, or the first
# lines of a command); a refusal is a BadInput: one line, exit 2, nothing written.


def check_device(value: str | None) -> str | None:
    """The typer callback of every ``--device``: ``cpu``, ``cuda`` or ``cuda:N``
    (:func:`rlparity.config.settings.device_name`); anything else is a :class:`~rlparity.cli.contract.BadInput`."""
    from rlparity.config.settings import device_name

    if value is None:
        return None
    try:
        return device_name(value)
    except ValueError as err:
        raise BadInput(f"--device: {err}") from None


def device_option(default: str = "cpu", help: str = "the trainer's device (cuda on a GPU host)"):
    """A ``--device`` option (checked by :func:`check_device` when the command line is parsed)."""
    return typer.Option(default, help=help, callback=check_device)


def size_option():
    """A ``--size`` option: the built-in model an experiment builds when ``--model`` is not given."""
    return typer.Option("tiny", help="built-in model when --model is not given")


def gpu_memory_option():
    """A ``--gpu-memory-utilization`` option (``None``: the engine settings' own); see :func:`engine_overrides`."""
    return typer.Option(None, help="vLLM's gpu_memory_utilization (default: the engine settings')")


def engine_overrides(gpu_memory_utilization: float | None) -> dict:
    """The engine settings a ``--gpu-memory-utilization`` changes: none when it is not given (or 0)."""
    return {"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}


def effective_settings(arm: Any) -> dict[str, Any] | None:
    """An arm's ``engine_effective`` as stored (``None`` where the arm records none), read through its record."""
    from rlparity.trace import arm_record

    eff = arm_record(arm).engine_effective
    return None if eff is None else eff.to_attrs()


def check_model(value: str | None) -> str | None:
    """The typer callback of every model argument: a built-in name, a local path that exists, or a
    hub id (``org/name``). Something written as a local path (``/``, ``.``, ``~``, two or more
    ``/``) that does not exist is a :class:`~rlparity.cli.contract.BadInput`, before anything is built or started."""
    if value is None or value == "":
        return value
    from rlparity.models import SIZES

    text = str(value)
    if text in SIZES or Path(text).expanduser().exists():
        return value
    if text.startswith(("/", ".", "~")) or text.count("/") > 1 or text.endswith((".zarr", ".safetensors")):
        raise BadInput(f"{text}: no such model (checkpoint directory): pass an existing path, a hub id "
                       f"(org/name) or a built-in model ({', '.join(SIZES)})")
    return value


def comma_list(text: str | None, flag: str, choices: Sequence[str] | None = None) -> list[str] | None:
    """The items of a comma list given on the command line (``None`` stays ``None``).

    An empty item (``a,,b``, ``,``, a trailing comma), a repeated one or one outside ``choices``
    is a :class:`~rlparity.cli.contract.BadInput` naming the flag: an empty item never means a default.
    """
    if text is None:
        return None
    items = [x.strip() for x in str(text).split(",")]
    if not any(items) or "" in items:
        raise BadInput(f"{flag} {text!r}: an empty item; give a comma list without empty items"
                       + (f" from {', '.join(choices)}" if choices else ""))
    repeated = sorted({x for x in items if items.count(x) > 1})
    if repeated:
        raise BadInput(f"{flag} {text!r}: {repeated} given twice; name each item once")
    unknown = [x for x in items if choices is not None and x not in choices]
    if unknown:
        raise BadInput(f"{flag}: unknown {unknown}; choose from {', '.join(choices)}")
    return items


def positive_ints(text: str, flag: str) -> list[int]:
    """A comma list of positive integers (``1,2,4,8``); anything else is a :class:`~rlparity.cli.contract.BadInput`."""
    try:
        values = [int(x) for x in comma_list(text, flag) or []]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BadInput(f"{flag} {text!r}: give a comma list of positive integers, e.g. 1,2,4,8")
    return values


def output_folder(out: Path, *stores: str, flag: str = "--out") -> Path:
    """``out`` if a command may write its folder there (the stores ``stores`` inside it and its
    JSON), checked before any model loads: missing, empty, or one an earlier run of the command
    wrote (one of those stores is an rlparity store there). A file, or a folder of other files, is a
    :class:`~rlparity.cli.contract.BadInput` naming the flag; nothing is made here."""
    if out.exists() and not out.is_dir():
        raise BadInput(f"{flag} {out}: a file; give a folder ({', '.join(stores) or 'the results'} go there)")
    for name in stores:  # the stores first: their own refusal names what is in the way
        output_store(out / name, flag)
    if out.is_dir() and any(out.iterdir()):
        from rlparity.trace.storage.paths import store_kind

        if not any(store_kind(out / name) == "rlparity" for name in stores):
            others = sorted(p.name for p in out.iterdir())
            raise BadInput(f"{flag} {out}: a folder of other files ({', '.join(others[:3])}"
                           f"{', ...' if len(others) > 3 else ''}); give a new or empty folder")
    return out


def model_path(model: str) -> str:
    """``tiny`` / ``small`` build (or reuse) the built-in model; anything else is a path or hub id."""
    from rlparity.models import SIZES, make_model

    return str(make_model(model, progress=False)) if model in SIZES else model


def command_group(help: str, commands: Mapping[str, Callable]) -> typer.Typer:
    """A group of commands (``rlparity GROUP COMMAND``) with ``commands`` in this order."""
    group = typer.Typer(no_args_is_help=True, add_completion=False, help=help)
    for name, command in commands.items():
        group.command(name)(command)
    return group


def echo_json(value: Any) -> None:
    """Print strict JSON (NaN and infinities as ``null``)."""
    from rlparity.config.provenance import to_json

    typer.echo(to_json(value))


def block_progress():
    """The block reader's progress bar (``progress=`` of :func:`rlparity.trace.blocks`): tqdm on
    stderr, shown on a terminal only."""
    import functools
    import sys

    from tqdm import tqdm

    return functools.partial(tqdm, unit="block", disable=None, file=sys.stderr)


def dask_progress(on: bool):
    """A progress bar on stderr for the dask computations inside the block (a lazy trace's
    streamed reductions); shown on a terminal only, as the block reader's bar. Off: nothing."""
    import contextlib
    import sys

    if not on:
        return contextlib.nullcontext()
    from tqdm.dask import TqdmCallback

    return TqdmCallback(desc="chunks", unit="task", disable=None, file=sys.stderr)


__all__ = ["TrainerSide", "block_progress", "check_device", "check_model", "comma_list", "command_group",
           "dask_progress", "device_option", "echo_json", "engine_overrides", "engine_settings", "gpu_memory_option",
           "model_path", "output_folder", "output_store", "positive_ints", "read_prompts", "sampling_settings",
           "select_arms", "size_option", "validation_message"]
