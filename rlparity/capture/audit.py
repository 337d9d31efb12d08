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

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlparity.capture.profiles import DEFAULT_REFERENCE, load_profile
from rlparity.capture.settings import EngineSettings

WHY: dict[str, str] = {
    "logprobs_mode": "raw_logprobs are the log-softmax before temperature/top-k/top-p, not the distribution "
                     "the sampler drew from, so pi_old/mu is off by a temperature-dependent amount on every token.",
    "enable_prefix_caching": "a cached prefix is reused from another request's computation, so the same token's "
                             "logprob depends on which requests ran before (a different kernel path and batch).",
    "async_scheduling": "async scheduling overlaps scheduling with the previous step's execution, which changes "
                        "batch composition and, with inflight weight updates, which weights produced a token.",
    "head_dtype": "the LM head precision rounds every logit; a head in another precision than the trainer's "
                  "makes the two sides disagree on every token, growing with the logit magnitude.",
    "dtype": "the body precision changes every hidden state; the trainer must run the same dtype to recompute mu.",
    "attention_backend": "another attention kernel reduces in another order, so logprobs differ in the last bits "
                         "and greedy paths can diverge.",
    "enforce_eager": "compiled (torch.compile / CUDA graphs) and eager paths fuse and order operations "
                     "differently, moving logprobs by about 1e-4 and more.",
    "batch_invariant": "without batch-invariant kernels a request's logprobs depend on the other requests in "
                       "its batch, so the same prompt gives different outputs at temperature 0.",
    "max_num_seqs": "the batch size cap changes batch composition and so the reduction order of batched kernels.",
    "enable_chunked_prefill": "chunked prefill splits long prompts across steps and mixes them with decodes, "
                              "changing the kernels and batch a prompt token is computed in.",
    "disable_cascade_attn": "cascade attention computes a shared prefix once for many requests with another "
                            "kernel, so logprobs depend on which requests share the prefix.",
    "generation_config": "'auto' takes sampling defaults (temperature, top_k, top_p, repetition penalty) from the "
                         "model's generation_config.json, so requests that omit them sample from another "
                         "distribution than the trainer assumes.",
    "seed": "another engine seed gives other samples for unseeded requests, so arms are not comparable "
            "token by token.",
    "max_model_len": "a shorter context truncates or rejects long prompts.",
}

# profile field -> key in the effective configuration (same names here)
AUDITED = tuple(k for k in WHY)


@dataclass
class Difference:
    setting: str
    expected: Any
    effective: Any
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "expected": self.expected, "effective": self.effective,
                "why": self.why}


@dataclass
class AuditResult:
    """What differs between an engine's effective settings and a profile."""

    source: str
    profile: str
    effective: dict[str, Any]
    differences: list[Difference] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def names(self) -> list[str]:
        return [d.setting for d in self.differences]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "profile": self.profile, "ok": self.ok,
                "differences": [d.to_dict() for d in self.differences], "matched": self.matched,
                "notes": self.notes, "effective": self.effective}

    def __str__(self) -> str:
        head = f"audit of {self.source} against profile {self.profile!r}: "
        if self.ok:
            head += f"no difference ({len(self.matched)} settings checked)"
        else:
            head += f"{len(self.differences)} difference(s)"
        lines = [head]
        for d in self.differences:
            lines.append(f"  - {d.setting}: effective {d.effective!r}, profile wants {d.expected!r}\n"
                         f"      why it matters: {d.why}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def _norm(setting: str, value: Any, eff: Mapping[str, Any]) -> Any:
    if setting == "head_dtype" and value in ("model", None):
        return str(eff.get("dtype", value)).replace("torch.", "")
    if isinstance(value, str):
        return value.replace("torch.", "")
    return value


def compare(effective: Mapping[str, Any], profile: str | os.PathLike | EngineSettings = DEFAULT_REFERENCE,
            *, source: str = "engine") -> AuditResult:
    """Differences between an effective configuration (as :func:`effective_config` returns it)
    and every setting the profile fixes (fields it leaves ``None`` are not checked)."""
    settings = load_profile(profile)
    pname = profile if isinstance(profile, str) else ("<settings>" if isinstance(profile, EngineSettings)
                                                      else str(profile))
    want = settings.model_dump()
    res = AuditResult(source, str(pname), dict(effective))
    for key in AUDITED:
        expected = want.get(key)
        if expected is None:
            continue
        if key not in effective:
            res.notes.append(f"{key}: not recorded in the effective configuration, cannot be checked")
            continue
        e, w = _norm(key, effective[key], effective), _norm(key, expected, effective)
        if key == "attention_backend" and str(e).lower() == str(w).lower():
            e = w
        if e != w:
            res.differences.append(Difference(key, w, e, WHY[key]))
        else:
            res.matched.append(key)
    if effective.get("generation_config") == "auto":
        defaults = effective.get("generation_config_sampling_defaults")
        res.notes.append("generation_config is 'auto': requests that omit temperature/top_k/top_p take the "
                         f"model's generation_config.json defaults ({defaults or 'none in this model'})")
    if effective.get("device") == "cpu" and effective.get("async_scheduling") is False and \
            want.get("async_scheduling") is not False:
        res.notes.append("async_scheduling reads False: vLLM's CPU platform does not run it")
    return res


# ------------------------------------------------------------------------------ sources
_SERVER_HEADS = (("vllm", "serve"), ("python", "-m", "vllm.entrypoints.openai.api_server"),
                 ("-m", "vllm.entrypoints.openai.api_server"), ("vllm.entrypoints.openai.api_server",))


def parse_command_line(command: str | list[str]) -> dict[str, Any]:
    """Engine kwargs of a ``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server`` command
    line, parsed with vLLM's own server parser (so the server's defaults apply)."""
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
    """Effective configuration vLLM would run with for ``kwargs`` (engine kwargs or EngineArgs),
    resolved by vLLM without starting an engine."""
    from vllm.engine.arg_utils import EngineArgs

    from rlparity.capture._common import cpu_defaults, effective_config

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
        kw = {**cpu_defaults(EngineSettings()), **kw}
        args = EngineArgs(**kw)
    else:
        args = kwargs
    return effective_config(args.create_engine_config())


def effective_of(source: Any) -> tuple[dict[str, Any], str]:
    """``(effective configuration, description)`` of any audit source."""
    import xarray as xr

    from rlparity.capture._common import effective_config

    if isinstance(source, xr.Dataset):
        eff = source.attrs.get("engine_effective")
        if not eff:
            raise ValueError("the trace has no 'engine_effective' attr: it was not captured by rlparity")
        return dict(eff), f"trace arm {source.attrs.get('arm', '?')!r}"
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
            return effective_of(first)[0], f"trace {p} arm {first.attrs.get('arm')!r}"
        if " " in s or s.startswith("--") or s.startswith("vllm"):
            return resolve_kwargs(parse_command_line(s)), "command line"
        raise ValueError(f"cannot audit {s!r}: pass an Engine, a vllm.LLM, a trace, a YAML/JSON file of "
                         "engine kwargs or a vLLM command line")
    raise TypeError(f"cannot audit a {type(source).__name__}: pass an Engine, a vllm.LLM, a trace, a "
                    "command line, a kwargs mapping/YAML or a Server")


def audit(source: Any, profile: str | os.PathLike | EngineSettings = DEFAULT_REFERENCE) -> AuditResult:
    """Audit ``source``'s effective settings against ``profile`` (default ``pipelinerl-parity``)."""
    eff, desc = effective_of(source)
    return compare(eff, profile, source=desc)


def audit_json(result: AuditResult) -> str:
    from rlparity._provenance import jsonable

    return json.dumps(jsonable(result.to_dict()), indent=2)


__all__ = ["WHY", "AuditResult", "Difference", "audit", "audit_json", "compare", "effective_of",
           "parse_command_line", "resolve_kwargs"]
