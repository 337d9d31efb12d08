"""The built-in models' task and tokenizer: arithmetic problems ``"<a><op><b>=<c>;"`` with skewed
operands and operators (:func:`make_problem`, :func:`make_prompts`), their checkable reward
(:func:`score_answers`) and the character-level tokenizer (:func:`build_tokenizer`)."""

from __future__ import annotations

import random
import re

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# digits and operators are used by the task; letters and a few symbols stay in the vocabulary
# so that top-k / top-p cut real (small-probability) tails, as in a natural-language model.
CHARS = list("0123456789+-*=;") + list(" abcdefghijklmnopqrstuvwxyz?!.,")
OPS = ["+", "-", "*"]
OP_WEIGHTS = [0.6, 0.3, 0.1]
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
