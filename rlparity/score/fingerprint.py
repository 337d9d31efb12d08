"""The fingerprint of the weights a trainer scores with: per-tensor checksums
(:mod:`rlparity.trace.weights`) under the checkpoint's own tensor names."""

from __future__ import annotations

from typing import Any

__all__ = ["checkpoint_checksums"]


def checkpoint_checksums(module: Any, *, stream: Any = None) -> dict[str, str]:
    """Per-tensor checksums of a transformers model's weights, keyed by checkpoint names.

    transformers' load-time conversions (e.g. a MoE model's per-expert tensors fused into one) are
    reverted as ``save_pretrained`` does, so the names and tensors are those of the checkpoint an
    engine loads.

    Parameters
    ----------
    module : transformers model
        The loaded model.
    stream : torch.cuda.Stream, optional
        The CUDA stream every kernel runs on, the conversions' and the copies'
        (:func:`rlparity.trace.weights.checksums`); None: the current one.

    Returns
    -------
    dict of str to str
        ``{tensor name: checksum}``.
    """
    from contextlib import nullcontext

    from rlparity.trace.weights import checksums

    on_stream: Any = nullcontext()
    if stream is not None:
        import torch

        on_stream = torch.cuda.stream(stream)
    with on_stream:
        state = dict(module.state_dict())
        try:
            from transformers.core_model_loading import revert_weight_conversion

            state = revert_weight_conversion(module, state)
        except ImportError:  # transformers without load-time conversions: names are the checkpoint's
            pass
    return checksums(state.items(), stream=stream)
