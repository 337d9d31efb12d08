"""Where the built models live and how a checkpoint is written: the cache folder, the build lock
beside a checkpoint, the write-then-rename save, and reading whether a checkpoint is a mixture of
experts."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from rlparity.models.task import CHAT_TEMPLATE

MODEL_MARKER = "rlparity_model.json"


def cache_root() -> Path:
    """rlparity's cache folder.

    Returns
    -------
    pathlib.Path
        ``$RLPARITY_CACHE``, default ``~/.cache/rlparity``.
    """
    return Path(os.environ.get("RLPARITY_CACHE", Path.home() / ".cache" / "rlparity"))


def default_model_path(size: str = "tiny") -> Path:
    """Where :func:`~rlparity.models.build.make_model` caches a built-in size.

    Parameters
    ----------
    size : str, default "tiny"
        The size's name.

    Returns
    -------
    pathlib.Path
        ``$RLPARITY_CACHE/models/<size>`` (default cache: ``~/.cache/rlparity``).
    """
    return cache_root() / "models" / size


def ensure_chat_template(path: Path) -> None:
    """Add the chat template to a checkpoint built before it existed (weights untouched).

    Parameters
    ----------
    path : pathlib.Path
        The checkpoint folder.
    """
    cfg = path / "tokenizer_config.json"
    if (path / "chat_template.jinja").exists() or (cfg.exists() and "chat_template" in json.loads(cfg.read_text())):
        return
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)


@contextlib.contextmanager
def build_lock(out: Path):
    """An exclusive lock on ``.<name>.build-lock`` beside ``out`` while a checkpoint is checked or built.

    Parameters
    ----------
    out : pathlib.Path
        The checkpoint folder.

    Yields
    ------
    None
        While the lock is held.
    """
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.parent / f".{out.name}.build-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def save_checkpoint(model, tokenizer, out: Path, dtype: str, info: dict) -> None:
    """Write the checkpoint beside ``out`` and rename it into place (no half-written model).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The model.
    tokenizer : transformers.PreTrainedTokenizerFast
        Its tokenizer.
    out : pathlib.Path
        The checkpoint folder (replaced).
    dtype : str
        The weights' dtype (a ``torch`` attribute name).
    info : dict
        Written as :data:`MODEL_MARKER` (the recipe and what was built).
    """
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
