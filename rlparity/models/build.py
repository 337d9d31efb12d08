"""Building the models: :func:`make_model` trains a built-in size (or finishes a trained one) and
writes its checkpoint under the build lock; :func:`make_shape_model` writes a real model's shape
with random weights."""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict
from pathlib import Path

from rlparity.models.checkpoint import (
    MODEL_MARKER,
    build_lock,
    cache_root,
    default_model_path,
    ensure_chat_template,
    save_checkpoint,
)
from rlparity.models.specs import FINISH, SHAPES, SIZES, Finish, ModelSize
from rlparity.models.task import build_tokenizer, make_problem


def make_model(
    size: str = "tiny",
    out: str | os.PathLike | None = None,
    *,
    seed: int = 0,
    vocab_pad_to: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Build, briefly train and save a small Llama (or Qwen3-MoE) checkpoint; return its path.

    Deterministic for a given ``size``, ``seed`` and ``vocab_pad_to`` on one device. Sizes of
    :data:`FINISH` (``tiny-bf16``, ``small-bf16``) are their base model, built or reused first, with
    the finish applied. The checkpoint is written beside ``out`` and renamed into place.

    Parameters
    ----------
    size : str, default "tiny"
        A key of :data:`SIZES` (``tiny``, ``tiny-bf16``, ``small``, ``small-bf16``, ``tiny-moe``,
        ``small-moe``).
    out : str or os.PathLike, optional
        Where to save; ``None`` means :func:`~rlparity.models.checkpoint.default_model_path`.
    seed : int, default 0
        Seeds the weights and the training data.
    vocab_pad_to : int, optional
        Pad the vocabulary (:func:`~rlparity.models.task.build_tokenizer`); ``None``: the base vocabulary.
    device : str, default "cpu"
        Where it trains.
    dtype : str, default "float32"
        The ``torch_dtype`` written into the config (what ``dtype="auto"`` loads); a finished size
        uses its finish's dtype.
    force : bool, default False
        Rebuild even when ``out`` holds a checkpoint of the same recipe (otherwise reused).
    progress : bool, default True
        Show the training progress bar.

    Returns
    -------
    pathlib.Path
        The checkpoint directory.

    Raises
    ------
    ValueError
        If the size is unknown.
    """
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    spec = SIZES[size]
    out = Path(out) if out is not None else default_model_path(size)
    finish = FINISH.get(size)
    if finish is not None:
        dtype = finish.dtype
    recipe = {"size": size, "seed": seed, "vocab_pad_to": vocab_pad_to, "dtype": dtype,
              "spec": _spec_record(spec), "recipe_version": 1, **_recipe_extra(spec, device)}
    if finish is not None:
        recipe["finish"] = asdict(finish)
    # two processes asking for the same checkpoint (the two test lanes, two notebooks) build it once: the
    # second waits here and then finds the first one's marker
    with build_lock(out):
        return _make_model(size, spec, out, recipe, finish, seed=seed, vocab_pad_to=vocab_pad_to, device=device,
                           dtype=dtype, force=force, progress=progress)


def _make_model(size, spec, out: Path, recipe: dict, finish, *, seed: int, vocab_pad_to, device: str, dtype: str,
                force: bool, progress: bool) -> Path:
    """:func:`make_model` under its build lock."""
    marker = out / MODEL_MARKER
    if not force and marker.exists():
        try:
            if json.loads(marker.read_text())["recipe"] == recipe:
                ensure_chat_template(out)
                return out
        except (ValueError, KeyError):
            pass

    if finish is not None:
        return _finished_model(size, finish, out, recipe, seed=seed, device=device, force=force, progress=progress)

    import torch
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_tokenizer(vocab_pad_to)
    model = _new_model(spec, tokenizer, device)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=spec.lr, total_steps=spec.train_steps,
                                                pct_start=0.1)
    model.train()
    losses = []
    bar = tqdm(range(spec.train_steps), desc=f"training {size} model", disable=not progress)
    for _ in bar:
        batch = _training_batch(rng, tokenizer, spec.batch_size, spec.seq_len).to(device)
        loss = (model(input_ids=batch, labels=batch, output_router_logits=True).loss if spec.moe
                else model(input_ids=batch, labels=batch).loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    save_checkpoint(model, tokenizer, out, dtype, {"recipe": recipe, "final_loss": sum(losses[-20:]) / min(20, len(losses)),
                                         "vocab_size": len(tokenizer)})
    return out


def _spec_record(spec: ModelSize) -> dict:
    """The spec as recorded in a checkpoint's recipe; a dense size leaves the MoE fields out, so the
    recipes (and cached checkpoints) of sizes built before the MoE fields existed stay valid."""
    d = asdict(spec)
    if not spec.moe:
        for k in ("num_experts", "experts_per_token", "moe_intermediate_size", "router_aux_loss"):
            d.pop(k)
    return d


def _recipe_extra(spec: ModelSize, device: str) -> dict:
    """What else a MoE build depends on: the experts' implementation while training."""
    return {"experts_implementation": experts_implementation(device)} if spec.moe else {}


def _new_model(spec: ModelSize, tokenizer, device: str):
    """A freshly initialised Llama (dense sizes) or Qwen3-MoE (``spec.moe``) for the tokenizer."""
    common = dict(vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                  num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                  num_key_value_heads=spec.num_heads, max_position_embeddings=2048,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    if not spec.moe:
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**common)).to(device)
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(**common, head_dim=spec.hidden_size // spec.num_heads, num_experts=spec.num_experts,
                            num_experts_per_tok=spec.experts_per_token,
                            moe_intermediate_size=spec.moe_intermediate_size, norm_topk_prob=True,
                            router_aux_loss_coef=spec.router_aux_loss, decoder_sparse_step=1)
    model = Qwen3MoeForCausalLM(config)
    # the loop over experts on CPU (transformers' default there is ~6x slower to train), grouped GEMMs on a GPU
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(experts_implementation(device))
    return model.to(device)


def experts_implementation(device: str) -> str:
    """How transformers computes a MoE model's experts while :func:`make_model` trains it.

    Parameters
    ----------
    device : str
        The training device.

    Returns
    -------
    str
        ``"grouped_mm"`` on CUDA, else ``"eager"``.
    """
    return "grouped_mm" if device.startswith("cuda") else "eager"


def _training_batch(rng: random.Random, tokenizer, batch_size: int, seq_len: int):
    import torch

    rows = []
    for _ in range(batch_size):
        text = ""
        while len(text) < seq_len:
            text += make_problem(rng)
        ids = tokenizer(text[: seq_len - 1])["input_ids"]  # <bos> prepended
        rows.append(ids[:seq_len])
    return torch.tensor(rows, dtype=torch.long)


def _finish(model, tokenizer, finish: Finish, rng: random.Random, device: str):
    """Apply :class:`~rlparity.models.specs.Finish` to a trained model: scale the head, grow the vocabulary with tokens
    the model never predicts (logits well below the typical ones)."""
    import torch

    g = torch.Generator().manual_seed(rng.randrange(2 ** 31))  # on the CPU: the same draws on any device
    with torch.no_grad():
        head = model.get_output_embeddings()
        dev = head.weight.device  # the model's device (``device``), where every tensor below lives
        head.weight.mul_(finish.logit_scale)
        if finish.vocab_to is not None and finish.vocab_to > head.weight.shape[0]:
            # the direction of typical final hidden states: the new rows point against it
            batch = _training_batch(rng, tokenizer, 16, 64).to(dev)
            hidden = model.model(input_ids=batch).last_hidden_state.reshape(-1, head.weight.shape[1])
            mean = hidden.mean(dim=0)
            unit = mean / mean.norm()
            typical = (hidden @ head.weight.T).mean().item()
            n_new = finish.vocab_to - head.weight.shape[0]
            below = (10.0 + 15.0 * torch.rand(n_new, generator=g)).to(dev)  # 10-25 below the typical logit
            proj = float(hidden @ unit @ torch.ones(hidden.shape[0], dtype=hidden.dtype, device=dev) / hidden.shape[0])
            rows = ((typical - below) / proj).unsqueeze(1) * unit.unsqueeze(0)
            rows += 0.02 * head.weight.std() * torch.randn(n_new, head.weight.shape[1], generator=g).to(dev)
            old = head.weight.shape[0]
            model.resize_token_embeddings(finish.vocab_to, mean_resizing=False)
            model.get_output_embeddings().weight[old:] = rows.to(head.weight.dtype)
            tokenizer = build_tokenizer(finish.vocab_to)
            model.config.vocab_size = finish.vocab_to
    return model, tokenizer


def make_shape_model(shape: str = "1.5b", out: str | os.PathLike | None = None, *, seed: int = 0,
                     device: str = "cpu", dtype: str = "bfloat16", force: bool = False) -> Path:
    """A checkpoint with a real model's shape and random weights (seeded).

    It carries the built-in character tokenizer padded to the shape's vocabulary, and loads through
    ``from_pretrained`` and ``vllm.LLM(model=...)`` like any checkpoint. Untrained: its
    distributions are near uniform, which is what a rescoring benchmark or a floor measurement at
    that shape needs, not a semantic test. Reused when ``out`` holds the same recipe.

    Parameters
    ----------
    shape : str, default "1.5b"
        A key of :data:`SHAPES` (``1.5b``: Qwen2-1.5B's shape; ``7b``: Llama-2-7B's).
    out : str or os.PathLike, optional
        Where to save; ``None`` means ``$RLPARITY_CACHE/models/shape-<shape>-<dtype>``.
    seed : int, default 0
        Seeds the weights.
    device : str, default "cpu"
        Where the weights are made.
    dtype : str, default "bfloat16"
        The checkpoint's dtype.
    force : bool, default False
        Rebuild even when ``out`` holds the same recipe.

    Returns
    -------
    pathlib.Path
        The checkpoint directory.

    Raises
    ------
    ValueError
        If the shape is unknown.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
    spec = SHAPES[shape]
    out = Path(out) if out is not None else cache_root() / "models" / f"shape-{shape}-{dtype}"
    recipe = {"shape": shape, "spec": spec, "seed": seed, "dtype": dtype, "recipe_version": 1}
    marker = out / MODEL_MARKER
    if marker.exists() and not force and json.loads(marker.read_text()).get("recipe") == recipe:
        return out
    torch.manual_seed(seed)
    cfg = LlamaConfig(**spec, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    save_checkpoint(model, build_tokenizer(vocab_pad_to=spec["vocab_size"]), out, dtype,
          {"recipe": recipe, "vocab_size": spec["vocab_size"], "trained": False})
    return out


def _finished_model(size: str, finish: Finish, out: Path, recipe: dict, *, seed: int, device: str, force: bool,
                    progress: bool) -> Path:
    """``finish`` applied to the trained ``finish.base`` model (built or reused first)."""
    import torch
    from transformers import AutoModelForCausalLM

    base = make_model(finish.base, seed=seed, device=device, progress=progress)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).to(device).eval()
    tokenizer = build_tokenizer()
    model, tokenizer = _finish(model, tokenizer, finish, random.Random(seed), device)
    save_checkpoint(model, tokenizer, out, finish.dtype, {"recipe": recipe, "base": str(base), "vocab_size": len(tokenizer)})
    return out
