"""The dropout of a transformers model: set it everywhere (a trainer that scores with dropout on) and
read the largest probability back (recorded with every scoring)."""

from __future__ import annotations

__all__ = ["dropout_of", "set_dropout"]


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
