"""Compare an engine's *effective* settings with a profile, with why each difference matters.

Pure data: the effective configuration is a mapping (as :func:`rlparity.capture.effective_config`
reads it from a running engine, or as a trace records it in ``attrs["engine_effective"]``).
Reading it from engines, command lines and kwargs is :mod:`rlparity.capture.audit`'s job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlparity.config.defaults import defaults
from rlparity.config.profiles import load_profile
from rlparity.config.settings import EngineSettings, dtype_name

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
    """One setting whose effective value differs from the profile's.

    Parameters
    ----------
    setting : str
        The setting's name (a field of :class:`~rlparity.config.EngineSettings`).
    expected : Any
        The profile's value.
    effective : Any
        The engine's effective value.
    why : str
        Why the difference matters (from :data:`WHY`).
    """

    setting: str
    expected: Any
    effective: Any
    why: str

    def to_dict(self) -> dict[str, Any]:
        """This difference as a plain mapping.

        Returns
        -------
        dict[str, Any]
            ``setting``, ``expected``, ``effective`` and ``why``.
        """
        return {"setting": self.setting, "expected": self.expected, "effective": self.effective,
                "why": self.why}


@dataclass
class AuditResult:
    """What differs between an engine's effective settings and a profile.

    Parameters
    ----------
    source : str
        What was audited (an engine, a command line, a trace).
    profile : str
        The profile's name or path.
    effective : dict[str, Any]
        The effective configuration that was compared.
    differences : list[Difference], default []
        The settings that differ.
    matched : list[str], default []
        The settings that were checked and agree.
    notes : list[str], default []
        Settings that could not be checked, and other remarks.
    """

    source: str
    profile: str
    effective: dict[str, Any]
    differences: list[Difference] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def nothing_checked(self) -> bool:
        """True when the source recorded none of the settings the profile fixes: not a pass."""
        return not self.differences and not self.matched

    @property
    def ok(self) -> bool:
        """No difference, and at least one setting was checked."""
        return not self.differences and not self.nothing_checked

    def names(self) -> list[str]:
        """The names of the settings that differ.

        Returns
        -------
        list[str]
            One name per :class:`Difference`, in order.
        """
        return [d.setting for d in self.differences]

    def to_dict(self) -> dict[str, Any]:
        """The audit as a plain mapping (for JSON).

        Returns
        -------
        dict[str, Any]
            ``source``, ``profile``, ``ok``, ``nothing_checked``, ``differences`` (as mappings),
            ``matched``, ``notes`` and ``effective``.
        """
        return {"source": self.source, "profile": self.profile, "ok": self.ok, "nothing_checked": self.nothing_checked,
                "differences": [d.to_dict() for d in self.differences], "matched": self.matched,
                "notes": self.notes, "effective": self.effective}

    def __str__(self) -> str:
        head = f"audit of {self.source} against profile {self.profile!r}: "
        if self.nothing_checked:
            head += "NOTHING CHECKED: the source records none of the settings the profile fixes"
        elif self.ok:
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
        return dtype_name(eff.get("dtype", value))
    if isinstance(value, str):
        return dtype_name(value)
    return value


def compare(effective: Mapping[str, Any], profile: str | os.PathLike | EngineSettings | None = None,
            *, source: str = "engine") -> AuditResult:
    """Compare an effective configuration with every setting a profile fixes.

    Fields the profile leaves ``None`` are not checked; a fixed setting the configuration does not
    record is a note, not a difference.

    Parameters
    ----------
    effective : Mapping[str, Any]
        The effective configuration (as :func:`rlparity.capture.effective_config` returns it, or a
        trace's ``attrs["engine_effective"]``).
    profile : str, path or EngineSettings, optional
        A profile name, a YAML path or the settings themselves; ``None`` is ``defaults().profile``.
    source : str, default "engine"
        What the configuration was read from, for the report.

    Returns
    -------
    AuditResult
        The differences (each with why it matters), the matched settings and notes.
    """
    profile = defaults().profile if profile is None else profile
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
        model_defaults = effective.get("generation_config_sampling_defaults")
        res.notes.append("generation_config is 'auto': requests that omit temperature/top_k/top_p take the "
                         f"model's generation_config.json defaults ({model_defaults or 'none in this model'})")
    if effective.get("device") == "cpu" and effective.get("async_scheduling") is False and \
            want.get("async_scheduling") is not False:
        res.notes.append("async_scheduling reads False: vLLM's CPU platform does not run it")
    return res




def audit_json(result: AuditResult) -> str:
    """An audit as indented JSON.

    Parameters
    ----------
    result : AuditResult
        The audit.

    Returns
    -------
    str
        :meth:`AuditResult.to_dict`, made JSON-safe, indented by two spaces.
    """
    from rlparity.config.provenance import jsonable

    return json.dumps(jsonable(result.to_dict()), indent=2)


__all__ = ["AUDITED", "WHY", "AuditResult", "Difference", "audit_json", "compare"]
