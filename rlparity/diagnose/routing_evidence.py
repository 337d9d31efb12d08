"""The MoE-routing part of an arm's evidence (:mod:`rlparity.diagnose.evidence` claims with it): the
precision of each side's router, read through the arm record, the cause routing flips are claimed
under, and the claim of the tokens the two sides routed to other experts.
"""

from __future__ import annotations

from typing import Any

import xarray as xr

from rlparity.metrics import routing as mr
from rlparity.trace import arm_record

def router_dtypes(trace: xr.Dataset) -> dict[str, str | None]:
    """The precision of each side's MoE router projection.

    The engine's is its body dtype (vLLM's router GEMM runs on the body's operands; its
    fp32-accurate ``enable_bf16x3_router_gemm`` needs float32 router weights on an SM100 GPU), the
    trainer's what its scorer recorded (``trainer_router``).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.

    Returns
    -------
    dict of str to str or None
        ``{"engine": dtype, "trainer": dtype}``, None where not recorded.
    """
    rec = arm_record(trace)
    engine = rec.effective.dtype or rec.requested.dtype
    trainer = (rec.trainer_router or {}).get("router_dtype")
    return {"engine": str(engine) if engine else None, "trainer": str(trainer) if trainer else None}


_BITS = {"float32": 24, "float16": 11, "bfloat16": 8}


def routing_cause(trace: xr.Dataset) -> str:
    """The cause routing flips are claimed under.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.

    Returns
    -------
    str
        The side whose router runs in the lower precision (``"trainer_bf16_router"`` /
        ``"rollout_bf16_router"``), else ``"moe_routing_disagreement"``.
    """
    dt = router_dtypes(trace)
    e, t = _BITS.get(dt["engine"] or "", 0), _BITS.get(dt["trainer"] or "", 0)
    if e and t and t < e:
        return "trainer_bf16_router"
    if e and t and e < t:
        return "rollout_bf16_router"
    return "moe_routing_disagreement"


def routing_claims(ev: Any) -> bool:
    """Claim the tokens a MoE model routed to other experts on the two sides, in place.

    A token with a routing flip in at least one layer is claimed unless another cause already
    explains it (flips on the tokens of a version whose weights differ are that mismatch's doing).

    Parameters
    ----------
    ev : rlparity.diagnose.evidence.ArmEvidence
        The evidence to add the claim to (its ``trace``, ``claimed()`` and ``claim``).

    Returns
    -------
    bool
        Whether anything was claimed.
    """
    if not mr.has_routes(ev.trace):
        return False
    flipped = mr.flips(ev.trace).any("moe_layer").values & ~ev.claimed()
    if not flipped.any():
        return False
    ev.claim(routing_cause(ev.trace), flipped, "tokens routed to other experts by the engine and the trainer "
             "(a routing flip in at least one MoE layer)")
    return True


__all__ = ["router_dtypes", "routing_cause", "routing_claims"]
