"""The trainer's model: loaded with ``from_pretrained`` as a user's trainer loads it (or taken as it
is passed), prepared as :class:`~rlparity.config.settings.TrainerSettings` asks (attention
implementation, gradient checkpointing, dropout), and its dropout read back for the record."""

from __future__ import annotations

from typing import Any

from rlparity.config.settings import TrainerSettings

__all__ = ["dropout_of", "load_trainer_model", "set_dropout"]


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
