"""The trainer's model: loaded with ``from_pretrained`` as a user's trainer loads it (or taken as it
is passed), prepared as :class:`~rlparity.config.settings.TrainerSettings` asks (attention
implementation, gradient checkpointing, dropout), and its dropout read back for the record."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any

from rlparity.config.settings import TrainerSettings

__all__ = ["FLOAT32_ATTENTION", "attention_switched", "dropout_of", "load_trainer_model", "register_float32_attention",
           "second_attention", "set_dropout"]


def load_trainer_model(model: Any, dtype: str, device: str, settings: TrainerSettings, *,
                       trust_remote_code: bool = False) -> tuple[Any, bool, str]:
    """The transformers model a :class:`~rlparity.score.Scorer` runs, on ``device``.

    Parameters
    ----------
    model : str, os.PathLike or transformers model
        A local path or hub id (loaded here in eval mode, in ``dtype``), or an already loaded causal
        LM (moved to ``device``, used in its own dtype).
    dtype : str
        The body's precision for a model loaded here.
    device : str
        Torch device.
    settings : TrainerSettings
        The attention implementation, gradient checkpointing and dropout to set.
    trust_remote_code : bool, default False
        Passed to ``from_pretrained``.

    Returns
    -------
    tuple of (transformers model, bool, str)
        The model, whether it was loaded here, and its dtype (a passed model's own).
    """
    import torch
    from transformers import AutoModelForCausalLM

    loaded_here = not hasattr(model, "get_decoder")
    if not loaded_here:  # a loaded model (e.g. the trainer's, after a step)
        module = model.to(device)
        dtype = str(module.dtype).removeprefix("torch.")  # what it is, not what was asked
    else:
        extra = ({"attn_implementation": settings.attn_implementation}
                 if settings.attn_implementation else {})
        module = AutoModelForCausalLM.from_pretrained(
            str(model), dtype=getattr(torch, dtype),
            trust_remote_code=trust_remote_code, **extra).to(device).eval()
    if settings.attn_implementation and not loaded_here:
        module.set_attn_implementation(settings.attn_implementation)
    if settings.gradient_checkpointing:
        module.gradient_checkpointing_enable()
    if settings.dropout is not None:
        set_dropout(module, settings.dropout)
    return module, loaded_here, dtype


# the kernel check's default second implementation: the trainer's attention computed in float32 (SDPA on
# float32 copies of q, k, v; the output rounded back to the model's dtype), registered with transformers'
# attention and mask interfaces by register_float32_attention
FLOAT32_ATTENTION = "rlparity_float32_sdpa"


def _float32_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention on float32 copies of ``query``, ``key``, ``value`` (and a float mask), the
    output rounded back to the query's dtype: :data:`FLOAT32_ATTENTION`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask = (attention_mask.float() if attention_mask is not None and attention_mask.is_floating_point()
            else attention_mask)
    out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), mask, **kwargs)
    return out.to(query.dtype), weights


@functools.cache
def register_float32_attention() -> str:
    """Register :data:`FLOAT32_ATTENTION` with transformers (once per process) and return its name.

    The attention of the layer in float32: what a correct kernel computes before its output is rounded
    to the model's dtype. Beside a bf16 kernel it measures that kernel's own rounding (the part of the
    floor any two implementations of the same model differ by); beside a float32 model it is the same
    computation (a floor of 0). EAGER attention is no such reference: it rounds the scores and the
    probabilities to bf16 (measured on the tiny model: 4.8x the float32 reference's floor).

    Returns
    -------
    str
        :data:`FLOAT32_ATTENTION`.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FLOAT32_ATTENTION, _float32_sdpa)
    AttentionMaskInterface.register(FLOAT32_ATTENTION, sdpa_mask)
    return FLOAT32_ATTENTION


def second_attention(current: str | None, asked: str = "auto") -> str | None:
    """The attention implementation the trainer's kernel check scores with, beside ``current``.

    Parameters
    ----------
    current : str or None
        The model's attention implementation (``config._attn_implementation``).
    asked : str, default "auto"
        ``TrainerSettings.kernel_check``: ``"off"``, ``"auto"``
        (:data:`FLOAT32_ATTENTION`, registered here) or an implementation's name.

    Returns
    -------
    str or None
        The second implementation; None when the check is off or would score with ``current`` again.
    """
    if asked == "off":
        return None
    second = register_float32_attention() if asked == "auto" else asked
    return None if second == current else second


@contextmanager
def attention_switched(module, name: str):
    """Run a transformers model with another attention implementation, and put its own back after.

    Parameters
    ----------
    module : transformers model
        The model (switched in place: ``set_attn_implementation``).
    name : str
        The implementation to run with.

    Yields
    ------
    str or None
        The implementation the model had.
    """
    before = getattr(module.config, "_attn_implementation", None)
    module.set_attn_implementation(name)
    try:
        yield before
    finally:
        if before is not None:
            module.set_attn_implementation(before)


def set_dropout(module, p: float) -> None:
    """Set every dropout probability of a transformers model to ``p``, in place.

    ``nn.Dropout`` layers, the attention modules' ``attention_dropout`` (what Llama-style attention
    reads in train mode) and the config's dropout fields.

    Parameters
    ----------
    module : torch.nn.Module
        A transformers model.
    p : float
        The dropout probability.
    """
    import torch

    for m in module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = float(p)
        if hasattr(m, "attention_dropout") and isinstance(getattr(m, "attention_dropout"), (int, float)):
            m.attention_dropout = float(p)
    for key in ("attention_dropout", "hidden_dropout", "dropout"):
        if hasattr(module.config, key):
            setattr(module.config, key, float(p))


def dropout_of(module) -> float:
    """The largest dropout probability among a model's dropout layers and attention modules.

    Parameters
    ----------
    module : torch.nn.Module
        A transformers model.

    Returns
    -------
    float
        The largest probability, 0.0 when there is none.
    """
    import torch

    ps = [float(m.p) for m in module.modules() if isinstance(m, torch.nn.Dropout)]
    ps += [float(m.attention_dropout) for m in module.modules()
           if isinstance(getattr(m, "attention_dropout", None), (int, float))]
    return max(ps, default=0.0)
