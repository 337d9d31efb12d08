"""Attribution: which cause explains how much of an arm's measured mismatch.

The measured mismatch is the excess of ``|d|`` (``d = log pi_old - log mu``, nats) over the floor,
summed over the usable tokens: ``N x (mean |d| - floor)``, the quantity slime gates on and verl
plots (mean ``|d|``), robust to the heavy tails one stale block or one flipped token gives. It is
split along the evidence (:mod:`rlparity.diagnose.evidence`, :class:`Decomposition`):

* ``semantic``: ``sum(|d| - |r|)``, the mismatch removed by matching the reading the rollout
  reports (``r = mu - matched reading``); it goes to the semantic cause found (raw logprobs), or,
  when the rollout matches neither reading, to the trainer-side sampling causes named;
* ``localized[c]``: ``sum(|r| - b)`` over the tokens cause ``c`` explains, ``b`` the mean ``|r|``
  of the tokens no cause explains (the background);
* ``global``: ``N (b - f)``, the background's excess over the floor ``f`` (the trainer's own,
  from its self-check), split among the causes that act on every token (a lower-precision head,
  dropout, a trainer temperature or cut, a penalty): dropout by its measured run-to-run spread,
  the rest evenly.

Every finding at WARNING or above gets its cause's share (``Finding.share``) and the tokens it
explains (``Finding.tokens``). The arm's headline is the finding whose cause explains the largest
share; verdicts that another cause explains become information with ``explained_by``: an
objective finding about the backend pair names the backend cause it comes from (a correction
configured over a broken backend stays an error), a "match neither" semantic verdict is explained
by the trainer-side sampling cause that makes it, zero-probability tokens by the trainer's other
cut, boundary flips by a lower-precision head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlparity.diagnose.causes import CAUSES, FLOOR_CAUSES
from rlparity.diagnose.evidence import ArmEvidence
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.metrics.floor_records import floor_mean_abs

# the evidence claim a cause's tokens are recorded under, where it differs from the cause
CLAIM_OF = {"partial_weight_sync": "weights_differ", "trainer_stale_weights": "weights_differ"}
SAMPLING_CAUSES = ("trainer_temperature", "trainer_top_k", "sampling_penalty")
HEAD_CAUSES = ("rollout_bf16_head", "trainer_bf16_head", "bf16_head_rounding")
NOISY_TRAINER = ("trainer_dropout",)
# findings that name a global cause from evidence on a few tokens only (see _global_estimates)
LOCAL_EVIDENCE = ("zero_probability_tokens",)
BACKEND_OBJECTIVE = ("backend_ratio_not_centred", "ess_collapse", "masked_fraction_high",
                     "correction_hides_backend_mismatch")
# the fix of a backend-pair objective finding on an arm at parity (gap_within_floor): the backend has nothing
# left to fix, so the method's third layer applies (issue 41: a clean H100 arm at parity read "fix the backend
# first" beside a sequence-product ESS of 0.22)
FIX_AT_PARITY = ("the backend pair is at parity on this hardware (gap_within_floor): what is left is the platform's "
                 "floor, which is the objective's to correct: token-level or length-normalised (geometric) sequence "
                 "weights instead of a product over the sequence, or truncated importance sampling; keep the "
                 "backend ratio (pi_old/mu) apart from the update ratio and watch the ESS after the change")


@dataclass
class Decomposition:
    """The measured excess mismatch of one arm, split by kind (see the module docstring).

    Every amount is in nats of ``|d|`` summed over the usable tokens, except ``floor`` and
    ``background``, which are per-token means.

    Parameters
    ----------
    n_tokens : int
        The usable tokens (finite d) of the arm.
    total : float
        ``sum |d|`` over them (nats).
    floor : float
        The trainer's own floor, mean ``|d|`` per token (nats).
    background : float
        ``b``: mean ``|r|`` of the tokens no cause explains (nats).
    semantic : float
        ``sum(|d| - |r|)``: the mismatch removed by matching the reading the rollout reports.
    global_ : float
        ``N (b - f)``: the background's excess over the floor.
    localized : dict of str to float, optional
        Per claimed cause, ``sum(|r| - b)`` over the tokens it explains.
    """

    n_tokens: int
    total: float
    floor: float
    background: float
    semantic: float
    global_: float
    localized: dict[str, float] = field(default_factory=dict)

    @property
    def excess(self) -> float:
        """The mismatch the causes share: semantic + global + every localized part.

        Returns
        -------
        float
            Nats of ``|d|`` summed over tokens.
        """
        return self.semantic + self.global_ + sum(self.localized.values())

    @property
    def floor_share(self) -> float | None:
        """The floor as a share of mean ``|d|``.

        A floor cause lies under the excess, so its share of that is 0 by construction; this says how
        much of the arm's mean ``|d|`` the floor is instead.

        Returns
        -------
        float or None
            ``floor / mean |d|``; ``None`` without tokens or without a mismatch.
        """
        return self.floor / (self.total / self.n_tokens) if self.n_tokens and self.total > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """The decomposition per usable token, JSON-ready.

        Returns
        -------
        dict
            ``n_tokens``, ``mean_abs_d``, ``excess_mean_abs_d``, ``floor_mean_abs``,
            ``background_mean_abs_r``, ``semantic_mean_abs``, ``global_mean_abs``,
            ``localized_mean_abs`` (per cause) and ``units`` (nats of ``|d|`` per usable token).
        """
        n = max(self.n_tokens, 1)
        return {"n_tokens": self.n_tokens, "mean_abs_d": self.total / n, "excess_mean_abs_d": self.excess / n,
                "floor_mean_abs": self.floor, "background_mean_abs_r": self.background,
                "semantic_mean_abs": self.semantic / n, "global_mean_abs": self.global_ / n,
                "localized_mean_abs": {c: v / n for c, v in self.localized.items()},
                "units": "nats of |d| per usable token (sum over tokens / N)"}


def decompose(ev: ArmEvidence) -> Decomposition:
    """Split the arm's excess mismatch into semantic, global and localized parts.

    Parameters
    ----------
    ev : ArmEvidence
        The arm's evidence (:func:`rlparity.diagnose.evidence.build`).

    Returns
    -------
    Decomposition
        The parts (see the module docstring), in nats of ``|d|`` summed over tokens.
    """
    u = ev.finite_tokens
    r = ev.residual if ev.residual is not None else -ev.d
    ok = u & np.isfinite(r)
    ad = np.abs(np.where(u, ev.d, 0.0))
    ar = np.abs(np.where(ok, r, 0.0))
    n = int(u.sum())
    free = ev.unclaimed() & np.isfinite(r)
    b = float(ar[free].mean()) if free.any() else 0.0
    f = floor_mean_abs(ev.trace, ev.side)
    sem = max(float(ad[ok].sum() - ar[ok].sum()), 0.0)
    glob = n * max(b - f, 0.0)
    loc = {}
    for cause, tokens in ev.claims.items():
        t = tokens & ok
        loc[cause] = max(float((ar[t] - b).sum()), 0.0)
    return Decomposition(n, float(ad.sum()), f, b, sem, glob, loc)


def _global_estimates(findings: list[Finding], ev: ArmEvidence, dec: Decomposition) -> dict[str, float]:
    """How the global part is split among the causes acting on every token."""
    # tokens outside the trainer's kept set are evidence about those tokens only: without a finding
    # that the two sides' cuts differ (trainer_cut_differs), they do not show a cause acting on every
    # token, and must not take the global excess (seen on a 1.5B-shape bf16 model on the H200: one
    # token outside the set took "100% of the excess", which was the bf16 body's noise)
    causes = [f.cause for f in findings if f.cause and f.severity.rank >= 1 and CAUSES.get(f.cause)
              and CAUSES[f.cause].kind == "global" and f.cause not in FLOOR_CAUSES
              and f.name not in LOCAL_EVIDENCE]
    causes = list(dict.fromkeys(causes))
    if not causes or dec.global_ <= 0:
        return {}
    out: dict[str, float] = {}
    rest = dec.global_
    if "trainer_dropout" in causes:
        run = ev.trainer_floor()["run_to_run_rms"]
        # one draw's mean |noise|: the difference of two draws has sqrt(2) times its RMS
        est = dec.n_tokens * run / np.sqrt(np.pi) if np.isfinite(run) else 0.0
        out["trainer_dropout"] = min(est, rest) if len(causes) > 1 else rest
        rest -= out["trainer_dropout"]
        causes.remove("trainer_dropout")
    for c in causes:
        out[c] = rest / len(causes)
    return out


def energies(findings: list[Finding], ev: ArmEvidence, dec: Decomposition) -> dict[str, float]:
    """The excess each named cause explains.

    The semantic part goes to ``raw_logprobs`` when named, else evenly to the causes that make the
    rollout match neither reading; the global part to the causes acting on every token (dropout by
    its measured run-to-run spread, the rest evenly); each localized part to its cause.

    Parameters
    ----------
    findings : list of Finding
        The arm's findings; the causes of those at WARNING or above are named.
    ev : ArmEvidence
        The arm's evidence.
    dec : Decomposition
        Its decomposition (:func:`decompose`).

    Returns
    -------
    dict of str to float
        ``{cause: excess}`` in nats of ``|d|`` summed over tokens.
    """
    named = {f.cause for f in findings if f.cause and f.severity.rank >= 1}
    out = {c: 0.0 for c in named}
    # semantic: to the reading's cause, else to the sampling causes that make the rollout match neither
    if "raw_logprobs" in named:
        out["raw_logprobs"] += dec.semantic
    else:
        makers = neither_makers(named)
        for c in makers:
            out[c] += dec.semantic / len(makers)
    for c, e in _global_estimates(findings, ev, dec).items():
        out[c] = out.get(c, 0.0) + e
    for c in named:
        out[c] += dec.localized.get(CLAIM_OF.get(c, c), 0.0)
    return out


def neither_makers(named: set[str]) -> list[str]:
    """The named causes that make a rollout match neither trainer reading.

    Parameters
    ----------
    named : set of str
        The causes named at WARNING or above.

    Returns
    -------
    list of str
        The trainer-side sampling causes named (another distribution), else a nondeterministic
        trainer (noisy readings); empty when none is named.
    """
    makers = [c for c in SAMPLING_CAUSES if c in named]
    return makers or [c for c in NOISY_TRAINER if c in named]


def _covering_claim(ev: ArmEvidence, share: float = 0.9) -> str | None:
    """The localized cause holding most of the probability-0 tokens, when the localized causes together hold at
    least ``share`` of them (two such causes may split them: a stale cache and KV carried over an update)."""
    zero = ev.mask & np.isneginf(ev.d)
    n = int(zero.sum())
    if not n:
        return None
    best = max(ev.claims.items(), key=lambda kv: int((kv[1] & zero).sum()), default=None)
    if best is None or (ev.claimed() & zero).sum() < share * n:
        return None
    return {"weights_differ": "weights_differ"}.get(best[0], best[0])


def _explain(f: Finding, by: str, why: str) -> Finding:
    return f.with_(severity=Severity.INFO, explained_by=by,
                   summary=f"{f.summary} [explained by {by}: {why}]")


def attribute(findings: list[Finding], ev: ArmEvidence | None) -> tuple[list[Finding], dict[str, Any]]:
    """Shares, tokens, headline and demotions for the findings of one arm (see the module docstring).

    Parameters
    ----------
    findings : list of Finding
        The arm's findings from every layer.
    ev : ArmEvidence or None
        The arm's evidence; None (or no residual) leaves the findings as they are.

    Returns
    -------
    findings : list of Finding
        The findings with ``share`` and ``tokens`` set and explained verdicts demoted to INFO
        (``explained_by``).
    record : dict
        The arm's attribution record: ``headline``, ``cause``, ``share``, ``also``, ``shares`` per
        cause, ``floor_share_of_mean_abs_d``, ``decomposition``, ``semantic_reading`` and
        ``tokens_explained``; empty without evidence.
    """
    if ev is None or ev.residual is None:
        return findings, {}
    dec = decompose(ev)
    named = {f.cause for f in findings if f.cause and f.severity.rank >= 1}
    out = list(findings)
    # demotions: verdicts another identified cause explains
    backend = [f for f in out if f.severity.rank >= 1 and f.layer != Layer.OBJECTIVE and f.cause]
    at_parity = any(f.name == "gap_within_floor" for f in out)
    for i, f in enumerate(out):
        if f.severity.rank < 1:
            continue
        out[i] = _demoted(f, out, named, ev, backend)
        if at_parity and out[i].severity.rank >= 1 and _on_backend_pair(out[i]) \
                and out[i].name != "correction_hides_backend_mismatch":
            out[i] = out[i].with_(fix=FIX_AT_PARITY)
    energy = energies(out, ev, dec)
    total = dec.excess
    shares = {c: (e / total if total > 0 else 0.0) for c, e in energy.items()}
    # a floor cause: say how much of mean |d| the floor is, so its line does not read "explains 0%"
    floor_share = dec.floor_share
    _set_shares(out, ev, shares, floor_share)
    head = _headline(out)
    record = {"headline": head.name if head else None, "cause": head.cause if head else None,
              "share": head.share if head else None,
              "also": [f.name for f in out if f.severity.rank >= 1 and f is not head],
              "shares": {c: float(s) for c, s in sorted(shares.items(), key=lambda kv: -kv[1])},
              "floor_share_of_mean_abs_d": floor_share,
              "decomposition": dec.to_dict(), "semantic_reading": ev.reading,
              "tokens_explained": {c: int((t & ev.finite_tokens).sum()) for c, t in ev.claims.items()}}
    return out, record


def _demoted(f: Finding, out: list[Finding], named: set[str], ev: ArmEvidence, backend: list[Finding]) -> Finding:
    """Finding ``f`` (a verdict) demoted to INFO where another identified cause explains it
    (:func:`_explain`), else ``f`` itself; ``out`` is the arm's findings as demoted so far."""
    if f.name == "logprobs_match_neither":
        makers = neither_makers(named)
        if makers:
            why = ("the trainer's readings move from run to run" if makers[0] in NOISY_TRAINER
                   else "the trainer's processed reading is another distribution")
            return _explain(f, makers[0], why)
    elif f.name == "zero_probability_tokens" and (by := _covering_claim(ev)) is not None:
        # the tokens lie where a localized cause already made the two sides compute different
        # distributions (another prompt, other weights, stale KV)
        return _explain(f, by, "they lie in the tokens it explains")
    elif f.name == "zero_probability_tokens" and not any(g.name == "trainer_cut_differs" for g in out):
        # tokens outside the trainer's set without a cut that differs: the engine cut penalised
        # logits, or the trainer's logits move from run to run
        by = next((c for c in ("sampling_penalty", *NOISY_TRAINER) if c in named), None)
        if by:
            return _explain(f, by, "the engine's kept set came from penalised logits" if by == "sampling_penalty"
                            else "the trainer's logits move from run to run")
    elif f.name == "zero_probability_tokens" and "trainer_top_k" in named:
        return _explain(f, "trainer_top_k", "the trainer cuts another top-k/top-p set")
    elif f.name == "topk_boundary_flips":
        by = next((c for c in (*HEAD_CAUSES, *NOISY_TRAINER) if c in named), None)
        if by:
            return _explain(f, by, "a lower-precision head moves logits across the cut" if by in HEAD_CAUSES
                            else "the trainer's logits move from run to run")
    elif _on_backend_pair(f) and backend:
        configured = f.evidence.get("correction")
        if f.name == "correction_hides_backend_mismatch" and isinstance(configured, str) \
                and configured.startswith("none"):
            return _explain(f, backend[0].cause, "no correction is configured; fix the backend first")
        elif f.name == "correction_hides_backend_mismatch":
            return f.with_(evidence={**f.evidence, "comes_from": [g.cause for g in backend]})
        else:
            return _explain(f, backend[0].cause, "the backend pair is broken by it")
    return f


def _on_backend_pair(f: Finding) -> bool:
    """Whether ``f`` is an objective finding about the backend pair (:data:`BACKEND_OBJECTIVE`)."""
    return f.layer == Layer.OBJECTIVE and f.name in BACKEND_OBJECTIVE and \
        str(f.evidence.get("pair", "")).startswith("backend")


def _set_shares(out: list[Finding], ev: ArmEvidence, shares: dict[str, float], floor_share: float | None) -> None:
    """Set each verdict's ``share`` and ``tokens`` in ``out`` (a floor cause's evidence gains its share of
    mean ``|d|``; a local cause without a share is marked outside the sum of ``|d|``)."""
    for i, f in enumerate(out):
        if f.severity.rank < 1 or not f.cause:
            continue
        tokens = f.tokens or ev.token_scope(CLAIM_OF.get(f.cause, f.cause))
        extra = {"evidence": {**f.evidence, "floor_share_of_mean_abs_d": floor_share}} \
            if f.cause in FLOOR_CAUSES and floor_share is not None else {}
        if f.name in LOCAL_EVIDENCE and not shares.get(f.cause):
            # its tokens have pi_old = 0: |d| is infinite there, outside the sum the shares divide
            extra = {"evidence": {**f.evidence, "outside_abs_d_sum": True}}
        out[i] = f.with_(share=float(shares.get(f.cause, 0.0)), tokens=tokens, **extra)


def _headline(out: list[Finding]) -> Finding | None:
    """The arm's headline: the verdict with the largest share (then severity, then layer order); a
    floor cause only when nothing else is wrong; without any share measured, the first in layer order."""
    problems = [f for f in out if f.severity.rank >= 1]
    order = {Layer.SEMANTIC: 0, Layer.INFERENCE_PATH: 1, Layer.OBJECTIVE: 2}
    head = None
    # a floor (the platform's own batch variance) heads the arm only when nothing else is wrong
    problems = [f for f in problems if f.cause not in FLOOR_CAUSES] or problems
    if problems:
        head = max(problems, key=lambda f: ((f.share or 0.0), f.severity.rank, -order[f.layer]))
        if not (head.share or 0) > 0:  # nothing measured: the first problem in layer order
            head = sorted(problems, key=lambda f: (order[f.layer], -f.severity.rank))[0]
    return head


__all__ = ["BACKEND_OBJECTIVE", "CLAIM_OF", "FIX_AT_PARITY", "Decomposition", "attribute", "decompose", "energies"]
