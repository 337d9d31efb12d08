"""The LM-head projection: float32 logits from the hidden states, the head in its ``head_dtype``
(torch only)."""

from __future__ import annotations

FP32_GEMMS = ("auto", "cast")


def project(hidden, weight, bias, head_dtype, fp32_gemm: str = "auto"):
    """LM-head logits ``(N, V)`` in float32, the head computed in ``head_dtype``.

    ``fp32_gemm="auto"``: a float32 head on CUDA over 16-bit hidden states and weights multiplies
    the 16-bit values (exact in float32) on the tensor cores with float32 accumulation and a
    float32 result, without a float32 copy of the weight. The result differs from cuBLAS's
    float32 GEMM only by the order of the float32 additions (about 3e-5 on logits of size 13,
    as far from the float64 product as that GEMM's own error; benchmarks/README.md). That is
    enough to move a token at an exact top-k tie (or at the top-p edge) in or out of the kept set:
    such a row's processed statistics then differ from the SGEMM's by up to about 1/k nats (2e-2
    seen on an H200); every other statistic stays within float32 rounding.
    ``"cast"`` (and any case "auto" does not cover) casts both to ``head_dtype`` first, as the
    reference and most trainers do.

    Parameters
    ----------
    hidden : torch.Tensor
        ``(N, H)`` hidden states.
    weight : torch.Tensor
        ``(V, H)`` LM-head weight.
    bias : torch.Tensor or None
        ``(V,)`` LM-head bias, or None.
    head_dtype : str or torch.dtype
        Precision of the head projection.
    fp32_gemm : {"auto", "cast"}, default "auto"
        How a float32 head multiplies 16-bit inputs (above).

    Returns
    -------
    torch.Tensor
        ``(N, V)`` float32 logits.

    Raises
    ------
    ValueError
        If ``fp32_gemm`` is not one of :data:`FP32_GEMMS`.
    """
    import torch

    if fp32_gemm not in FP32_GEMMS:
        raise ValueError(f"fp32_gemm={fp32_gemm!r}; use one of {FP32_GEMMS}")
    hd = getattr(torch, head_dtype) if isinstance(head_dtype, str) else head_dtype
    half = (torch.bfloat16, torch.float16)
    if (fp32_gemm == "auto" and hd == torch.float32 and hidden.is_cuda and hidden.dtype in half
            and weight.dtype == hidden.dtype and hidden.ndim == 2 and _mm_out_dtype()):
        logits = torch.mm(hidden, weight.t(), out_dtype=torch.float32)
        return logits.add_(bias.float()) if bias is not None else logits
    b = bias.to(hd) if bias is not None else None
    return torch.nn.functional.linear(hidden.to(hd), weight.to(hd), b).float()


_MM_OUT_DTYPE: bool | None = None


def _mm_out_dtype() -> bool:
    """Whether this torch multiplies 16-bit matrices into a float32 result (``mm(out_dtype=)``)."""
    global _MM_OUT_DTYPE
    if _MM_OUT_DTYPE is None:
        import torch

        try:
            a = torch.ones((2, 2), dtype=torch.bfloat16, device="cuda")
            _MM_OUT_DTYPE = torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OUT_DTYPE = False
    return _MM_OUT_DTYPE


__all__ = ["FP32_GEMMS", "project"]
