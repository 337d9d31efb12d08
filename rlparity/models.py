"""Small models built locally: a character tokenizer plus a standard Llama (or a Qwen3-MoE
mixture-of-experts: ``tiny-moe``, ``small-moe``), briefly trained.

Nothing is downloaded. :func:`make_model` writes a checkpoint with ``save_pretrained`` that
loads through exactly the path a hub model takes (``AutoModelForCausalLM.from_pretrained``,
``vllm.LLM(model=path)``).

The training task is a stream of arithmetic problems, ``"<a><op><b>=<c>;"``, with operands and
operators drawn from skewed distributions. After training, the answer digits are peaked (the
model has learned most of the arithmetic) while the operands of the next problem keep real,
non-uniform uncertainty: temperature, top-k and top-p all visibly change those distributions,
which is what the diagnostics need to show.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# digits and operators are used by the task; letters and a few symbols stay in the vocabulary
# so that top-k / top-p cut real (small-probability) tails, as in a natural-language model.
CHARS = list("0123456789+-*=;") + list(" abcdefghijklmnopqrstuvwxyz?!.,")
OPS = ["+", "-", "*"]
OP_WEIGHTS = [0.6, 0.3, 0.1]


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

MODEL_MARKER = "rlparity_model.json"
# a chat template that, like many real ones, writes the BOS token itself: rendering it to text and
# letting the engine add special tokens again doubles the BOS (a prompt-parity finding)
CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _sample_operand(rng: random.Random) -> int:
    # skewed (about 1/(n+3)) over 0..99: small numbers are common, large ones rare
    weights = [1.0 / (n + 3) for n in range(100)]
    return rng.choices(range(100), weights=weights)[0]


def make_problem(rng: random.Random) -> str:
    """One problem of the synthetic task, e.g. ``"12+7=19;"``.

    Operands are skewed towards small numbers (about ``1/(n+3)`` over 0..99; the second operand
    of ``*`` is 0..9) and operators weighted ``+`` 0.6, ``-`` 0.3, ``*`` 0.1.

    Parameters
    ----------
    rng : random.Random
        The random source.

    Returns
    -------
    str
        ``"<a><op><b>=<c>;"``.
    """
    op = rng.choices(OPS, weights=OP_WEIGHTS)[0]
    a = _sample_operand(rng)
    b = _sample_operand(rng) if op != "*" else rng.randrange(10)
    c = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a}{op}{b}={c};"


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """Prompts for the task: one solved problem, then the left side of a new one.

    Parameters
    ----------
    n : int
        How many prompts.
    seed : int, default 0
        Seeds the problems.

    Returns
    -------
    list of str
        E.g. ``"12+7=19;3*4="``.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        nxt = make_problem(rng)
        out.append(make_problem(rng) + nxt[: nxt.index("=") + 1])
    return out


_PROBLEM = re.compile(r"(-?\d+)([+\-*])(\d+)=(-?\d+);")


def score_answers(text: str) -> float:
    """Share of complete problems in ``text`` whose answer is correct (a checkable reward).

    Parameters
    ----------
    text : str
        A response (or any text).

    Returns
    -------
    float
        Correct over complete ``<a><op><b>=<c>;`` problems found; 0 when none is found.
    """
    found = _PROBLEM.findall(text)
    if not found:
        return 0.0
    ok = 0
    for a, op, b, c in found:
        a_, b_, c_ = int(a), int(b), int(c)
        ok += {"+": a_ + b_, "-": a_ - b_, "*": a_ * b_}[op] == c_
    return ok / len(found)


def build_tokenizer(vocab_pad_to: int | None = None):
    """A character-level ``PreTrainedTokenizerFast``, optionally padded with filler tokens.

    With ``add_special_tokens`` it puts ``<bos>`` before every text; its chat template writes the BOS itself.

    Parameters
    ----------
    vocab_pad_to : int, optional
        Grow the vocabulary to this size with ``<extra_i>`` tokens; ``None``: the base vocabulary
        (4 special tokens and the task's characters).

    Returns
    -------
    transformers.PreTrainedTokenizerFast
        The tokenizer.

    Raises
    ------
    ValueError
        If ``vocab_pad_to`` is smaller than the base vocabulary.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    if vocab_pad_to is not None:
        if vocab_pad_to < len(vocab):
            raise ValueError(
                f"vocab_pad_to={vocab_pad_to} is smaller than the base vocabulary ({len(vocab)}); "
                "pass a larger size or None"
            )
        for i in range(len(vocab), vocab_pad_to):
            vocab[f"<extra_{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


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
    """Apply :class:`Finish` to a trained model: scale the head, grow the vocabulary with tokens
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


def _cache_root() -> Path:
    return Path(os.environ.get("RLPARITY_CACHE", Path.home() / ".cache" / "rlparity"))


def default_model_path(size: str = "tiny") -> Path:
    """Where :func:`make_model` caches a built-in size.

    Parameters
    ----------
    size : str, default "tiny"
        The size's name.

    Returns
    -------
    pathlib.Path
        ``$RLPARITY_CACHE/models/<size>`` (default cache: ``~/.cache/rlparity``).
    """
    return _cache_root() / "models" / size


def _ensure_chat_template(path: Path) -> None:
    """Add the chat template to a checkpoint built before it existed (weights untouched)."""
    cfg = path / "tokenizer_config.json"
    if (path / "chat_template.jinja").exists() or (cfg.exists() and "chat_template" in json.loads(cfg.read_text())):
        return
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)


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
        Where to save; ``None`` means :func:`default_model_path`.
    seed : int, default 0
        Seeds the weights and the training data.
    vocab_pad_to : int, optional
        Pad the vocabulary (:func:`build_tokenizer`); ``None``: the base vocabulary.
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
    with _build_lock(out):
        return _make_model(size, spec, out, recipe, finish, seed=seed, vocab_pad_to=vocab_pad_to, device=device,
                           dtype=dtype, force=force, progress=progress)


@contextlib.contextmanager
def _build_lock(out: Path):
    """An exclusive lock on ``.<name>.build-lock`` beside ``out`` while a checkpoint is checked or built."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.parent / f".{out.name}.build-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _make_model(size, spec, out: Path, recipe: dict, finish, *, seed: int, vocab_pad_to, device: str, dtype: str,
                force: bool, progress: bool) -> Path:
    """:func:`make_model` under its build lock."""
    marker = out / MODEL_MARKER
    if not force and marker.exists():
        try:
            if json.loads(marker.read_text())["recipe"] == recipe:
                _ensure_chat_template(out)
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
    _save(model, tokenizer, out, dtype, {"recipe": recipe, "final_loss": sum(losses[-20:]) / min(20, len(losses)),
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


def is_moe(model) -> bool:
    """Whether a checkpoint or a loaded model is a mixture of experts (it declares routed experts).

    Parameters
    ----------
    model : str, os.PathLike or transformers.PreTrainedModel
        A path or hub id (read from its ``config.json``; a hub id that is not local is ``False``)
        or a loaded transformers model.

    Returns
    -------
    bool
        ``True`` when ``num_experts``, ``num_local_experts`` or ``n_routed_experts`` is above 0.
    """
    cfg = getattr(model, "config", None)
    if cfg is None:
        p = Path(str(model)) / "config.json"
        if not p.exists():
            return False
        cfg = json.loads(p.read_text())
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    return any((get(k) or 0) > 0 for k in ("num_experts", "num_local_experts", "n_routed_experts"))


def _save(model, tokenizer, out: Path, dtype: str, info: dict) -> None:
    """Write the checkpoint beside ``out`` and rename it into place (no half-written model)."""
    import torch

    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    model.to(getattr(torch, dtype)).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # generation_config.json stays neutral so vLLM's --generation-config auto adds nothing
    (tmp / MODEL_MARKER).write_text(json.dumps(info, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)


# real models' shapes with random weights (no training), for speed and floor measurements on a GPU
SHAPES: dict[str, dict] = {
    # Qwen2-1.5B's shape as a Llama (tied embeddings, grouped KV heads, its 151936-token vocabulary)
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    # Llama-2-7B's shape (a 32000-token vocabulary)
    "7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False},
}


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
    out = Path(out) if out is not None else _cache_root() / "models" / f"shape-{shape}-{dtype}"
    recipe = {"shape": shape, "spec": spec, "seed": seed, "dtype": dtype, "recipe_version": 1}
    marker = out / MODEL_MARKER
    if marker.exists() and not force and json.loads(marker.read_text()).get("recipe") == recipe:
        return out
    torch.manual_seed(seed)
    cfg = LlamaConfig(**spec, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    _save(model, build_tokenizer(vocab_pad_to=spec["vocab_size"]), out, dtype,
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
    _save(model, tokenizer, out, finish.dtype, {"recipe": recipe, "base": str(base), "vocab_size": len(tokenizer)})
    return out
