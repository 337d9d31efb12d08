"""The built-in model sizes (:data:`SIZES`), the finishes that make a trained size look like a real
checkpoint (:data:`FINISH`) and real models' shapes built with random weights (:data:`SHAPES`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSize:
    """Architecture and training budget of one built-in size.

    Parameters
    ----------
    hidden_size : int
        The hidden size.
    num_layers : int
        Decoder layers.
    num_heads : int
        Attention heads.
    intermediate_size : int
        The MLP's intermediate size (dense layers).
    train_steps : int
        Training steps.
    batch_size : int
        Sequences per training step.
    seq_len : int
        Tokens per training sequence.
    lr : float, default 3e-3
        The peak learning rate (AdamW, one-cycle schedule).
    num_experts : int, default 0
        Experts per MoE layer (Qwen3-MoE, every decoder layer sparse); 0 = a dense Llama.
    experts_per_token : int, default 0
        Experts each token is routed to (top-k).
    moe_intermediate_size : int, default 0
        Each expert's intermediate size.
    router_aux_loss : float, default 0.01
        Weight of the load-balancing loss while training, so every expert is used.
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    train_steps: int
    batch_size: int
    seq_len: int
    lr: float = 3e-3
    # mixture of experts (Qwen3-MoE, every decoder layer sparse); 0 experts = a dense Llama
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    router_aux_loss: float = 0.01  # load balancing while training, so every expert is used

    @property
    def moe(self) -> bool:
        """Whether the size is a mixture-of-experts model (Qwen3-MoE)."""
        return self.num_experts > 0


@dataclass(frozen=True)
class Finish:
    """What turns a built-in model into one whose numerics resemble a real checkpoint's.

    Applied to the trained weights of ``base`` (seconds on a CPU, no second training run).

    Parameters
    ----------
    base : str, default "tiny"
        The built-in size it starts from.
    logit_scale : float, default 1.0
        The LM head is multiplied by it, so the largest logits reach the 20-30 a trained LLM shows
        (the tiny model's are about 7); a bf16 head rounds them in steps of ``|z| * 2^-8`` and a
        bf16 body's noise grows with them.
    vocab_to : int, optional
        The vocabulary grows to this size with tokens the model never predicts, their logits 10-25
        below the typical ones, as the long tail of a real 30k-150k vocabulary; ``None``: unchanged.
    dtype : str, default "float32"
        The checkpoint's dtype (what ``dtype="auto"`` loads; bfloat16 as released models).
    """

    base: str = "tiny"
    logit_scale: float = 1.0
    vocab_to: int | None = None
    dtype: str = "float32"


FINISH: dict[str, Finish] = {
    "tiny-bf16": Finish(base="tiny", logit_scale=3.0, vocab_to=32000, dtype="bfloat16"),
    "small-bf16": Finish(base="small", logit_scale=3.0, vocab_to=32000, dtype="bfloat16"),
}

SIZES: dict[str, ModelSize] = {
    # CI: about a minute on 2 CPU cores; head_dim 32 (vLLM's CPU attention supports 32..512)
    "tiny": ModelSize(128, 2, 4, 256, train_steps=600, batch_size=32, seq_len=64),
    # CI beside tiny: the same network finished like a real checkpoint (see FINISH): bf16 weights,
    # logits up to ~25, a 32k vocabulary; so CPU tests cannot pass on float32 luck
    "tiny-bf16": ModelSize(128, 2, 4, 256, train_steps=600, batch_size=32, seq_len=64),
    # for the GPU host: same task, more capacity and training; head_dim 64
    "small": ModelSize(512, 8, 8, 1408, train_steps=1500, batch_size=64, seq_len=128, lr=1e-3),
    "small-bf16": ModelSize(512, 8, 8, 1408, train_steps=1500, batch_size=64, seq_len=128, lr=1e-3),
    # mixture of experts (Qwen3-MoE, as vLLM and transformers load it): CI, 8 experts, top-2 per token
    # in both layers; 300 steps (its expert loop makes a step ~3x a dense one): about 1.5 min on 2 CPU cores
    "tiny-moe": ModelSize(128, 2, 4, 256, train_steps=300, batch_size=32, seq_len=64,
                          num_experts=8, experts_per_token=2, moe_intermediate_size=64),
    # for the GPU host: 8 sparse layers of 64 experts, top-8 per token (the shape of Qwen3-30B-A3B's
    # routing, 128 experts top-8, scaled down); head_dim 64
    "small-moe": ModelSize(512, 8, 8, 1408, train_steps=600, batch_size=64, seq_len=128, lr=1e-3,
                           num_experts=64, experts_per_token=8, moe_intermediate_size=128),
}

# real models' shapes with random weights (no training), for speed and floor measurements on a GPU
SHAPES: dict[str, dict] = {
    # Qwen2-1.5B's shape as a Llama (tied embeddings, grouped KV heads, its 151936-token vocabulary)
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    # Llama-2-7B's shape (a 32000-token vocabulary)
    "7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False},
}
