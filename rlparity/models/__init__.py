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

from rlparity.models.build import experts_implementation, make_model, make_shape_model
from rlparity.models.checkpoint import MODEL_MARKER, default_model_path, is_moe
from rlparity.models.specs import FINISH, SHAPES, SIZES, Finish, ModelSize
from rlparity.models.task import (
    CHARS,
    CHAT_TEMPLATE,
    OP_WEIGHTS,
    OPS,
    SPECIAL_TOKENS,
    build_tokenizer,
    make_problem,
    make_prompts,
    score_answers,
)

__all__ = ["CHARS", "CHAT_TEMPLATE", "FINISH", "MODEL_MARKER", "OPS", "OP_WEIGHTS", "SHAPES", "SIZES", "SPECIAL_TOKENS",
           "Finish", "ModelSize", "build_tokenizer", "default_model_path", "experts_implementation", "is_moe",
           "make_model", "make_problem", "make_prompts", "make_shape_model", "score_answers"]
