"""Checkpoint files: reading, writing and perturbing safetensors checkpoints (no engine needed).

What the weight-update path (:mod:`rlparity.capture.weights`) and the experiments read and write:

* :func:`safetensors_files`, :func:`iter_safetensors`: the files of a checkpoint and its tensors,
  read lazily on CPU; :func:`checkpoint_names` (the tensor names, from the headers only) and
  :func:`checkpoint_checksums` (per-tensor checksums, for the trace attrs).
* :func:`resolve_source`: a checkpoint directory, a ``.safetensors`` file, or a state dict of
  tensors (written by :func:`write_state_dict` to a temporary safetensors file the workers read).
* :func:`perturbed_checkpoint`: a deterministic new version of a checkpoint (for experiments and
  tests: both sides load the same files).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any


def safetensors_files(path: str | os.PathLike) -> list[Path]:
    """The ``.safetensors`` files of a checkpoint directory (sorted), or the file itself.

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint directory or a ``.safetensors`` file.

    Returns
    -------
    list of pathlib.Path
        The files, sorted by name.

    Raises
    ------
    ValueError
        If ``path`` is a file that is not ``.safetensors``.
    FileNotFoundError
        If nothing is at ``path``, or the directory holds no ``.safetensors`` file.
    """
    p = Path(path)
    if p.is_file():
        if p.suffix != ".safetensors":
            raise ValueError(f"{p} is not a .safetensors file: pass a checkpoint directory or a .safetensors file")
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"no checkpoint at {p}: pass a directory with *.safetensors files, a "
                                ".safetensors file or a state dict")
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{p} holds no *.safetensors files: save the weights with "
                                "save_pretrained(..., safe_serialization=True) or pass a state dict")
    return files


def iter_safetensors(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """Every tensor of a checkpoint, read lazily on CPU.

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint directory or a ``.safetensors`` file (:func:`safetensors_files`).

    Yields
    ------
    tuple of (str, torch.Tensor)
        ``(name, tensor)``, file by file.
    """
    from safetensors import safe_open

    for f in safetensors_files(path):
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for name in fh.keys():
                yield name, fh.get_tensor(name)


def checkpoint_names(path: str | os.PathLike) -> list[str]:
    """The tensor names of a local safetensors checkpoint, read from the files' headers only (no
    tensor is loaded, torch is not needed): what a command checks before an engine starts.

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint directory or a ``.safetensors`` file (:func:`safetensors_files`).

    Returns
    -------
    list of str
        Every tensor name, sorted.

    Raises
    ------
    ValueError
        If a file is not a safetensors file (garbage, truncated, another format), or holds no tensor.
    FileNotFoundError
        If nothing is at ``path``, or the directory holds no ``.safetensors`` file.
    """
    import json
    import struct

    names: list[str] = []
    for f in safetensors_files(path):
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            try:
                if not 2 <= n <= size - 8:
                    raise ValueError
                header = json.loads(fh.read(n))
                if not isinstance(header, dict):
                    raise ValueError
            except (ValueError, UnicodeDecodeError):
                raise ValueError(f"{f} is not a safetensors file (no readable header): save the weights with "
                                 "save_pretrained(..., safe_serialization=True) or safetensors.torch.save_file") from None
        names += [k for k in header if k != "__metadata__"]
    if not names:
        raise ValueError(f"{path} holds no tensor: pass the checkpoint the weights were saved to")
    return sorted(names)


def checkpoint_checksums(path: str | os.PathLike) -> dict[str, str] | None:
    """Per-tensor checksums of a local checkpoint (:func:`rlparity.trace.weights.checksums`).

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint directory, a ``.safetensors`` file, or anything else (a hub id).

    Returns
    -------
    dict of str to str or None
        ``{tensor name: checksum}``; ``None`` when ``path`` is not a local safetensors checkpoint
        or holds more than :data:`~rlparity.trace.weights.MAX_FINGERPRINT_BYTES` (reading it would
        cost seconds).
    """
    from rlparity.trace.weights import MAX_FINGERPRINT_BYTES, checksums

    try:
        files = safetensors_files(path)
    except (FileNotFoundError, ValueError):
        return None
    if sum(f.stat().st_size for f in files) > MAX_FINGERPRINT_BYTES:
        return None
    return checksums(iter_safetensors(path))


def write_state_dict(state_dict: Mapping[str, Any], directory: str | os.PathLike | None = None) -> Path:
    """Write a state dict of tensors to ``model.safetensors`` and return the file.

    Tensors are copied to contiguous CPU memory (shared storage, as in tied weights, is written
    once per name).

    Parameters
    ----------
    state_dict : Mapping of str to torch.Tensor
        The tensors, by checkpoint name.
    directory : str or os.PathLike, optional
        Where to write (created if missing); ``None`` makes a new temporary directory.

    Returns
    -------
    pathlib.Path
        The written ``model.safetensors``.

    Raises
    ------
    TypeError
        If a value is not a tensor.
    """
    import torch
    from safetensors.torch import save_file

    bad = [k for k, v in state_dict.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"the state dict holds non-tensors at {bad[:5]}: pass name -> torch.Tensor")
    d = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="rlparity-weights-"))
    d.mkdir(parents=True, exist_ok=True)
    f = d / "model.safetensors"
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}, str(f))
    return f


def resolve_source(source: Any) -> tuple[Path, Callable[[], None], str]:
    """The path the workers read for a weights source, a cleanup and a description.

    Parameters
    ----------
    source : str, os.PathLike or Mapping of str to torch.Tensor
        A checkpoint directory, a ``.safetensors`` file or a state dict (written to a temporary
        file, removed by ``cleanup``).

    Returns
    -------
    tuple of (pathlib.Path, callable, str)
        ``(path the workers read, cleanup, description)``.

    Raises
    ------
    ValueError
        If the state dict is empty or a file is not ``.safetensors``.
    FileNotFoundError
        If a path holds no checkpoint.
    TypeError
        If ``source`` is of another type.
    """
    if isinstance(source, (str, os.PathLike)):
        files = safetensors_files(source)  # fails early, with the reason
        return Path(source).resolve(), (lambda: None), f"{Path(source)} ({len(files)} safetensors file(s))"
    if isinstance(source, Mapping):
        if not source:
            raise ValueError("the state dict is empty: pass the tensors of the new weights")
        f = write_state_dict(source)
        return f, (lambda: shutil.rmtree(f.parent, ignore_errors=True)), f"state dict ({len(source)} tensors)"
    raise TypeError(f"weights source {type(source).__name__}: pass a checkpoint directory, a .safetensors "
                    "file or a state dict of tensors")


_PERTURB_MARKER = "rlparity_perturbation.json"


def perturbed_checkpoint(model: str | os.PathLike, out: str | os.PathLike, *, sigma: float = 0.05,
                         seed: int = 0, include: str = ".layers.") -> Path:
    """A deterministic new version of a checkpoint, for experiments and tests.

    Every 2-d floating weight whose name contains ``include`` (the decoder layers) is multiplied by
    ``1 + sigma * N(0, 1)``, seeded per tensor from ``seed`` and its name (the same files on every
    machine and run). Config and tokenizer files are copied, so the result loads like the original
    (``from_pretrained``, ``LLM(model=out)``, :meth:`~rlparity.capture.AsyncEngine.update_weights`).
    Reused when ``out`` already holds the same recipe.

    Parameters
    ----------
    model : str or os.PathLike
        A local checkpoint directory.
    out : str or os.PathLike
        Where the new checkpoint goes (created if missing).
    sigma : float, default 0.05
        The relative noise per weight (> 0).
    seed : int, default 0
        The seed the per-tensor seeds derive from.
    include : str, default ".layers."
        Only weights whose name contains it are perturbed.

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    ValueError
        If ``sigma <= 0``.
    FileNotFoundError
        If ``model`` is not a local checkpoint directory (or holds no safetensors).
    """
    import json

    import torch
    from safetensors.torch import save_file

    if sigma <= 0:
        raise ValueError(f"sigma={sigma}: a perturbation needs sigma > 0 (relative noise per weight)")
    src, dst = Path(model), Path(out)
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a local checkpoint directory (the perturbation reads its safetensors)")
    recipe = {"source": str(src.resolve()), "sigma": float(sigma), "seed": int(seed), "include": include,
              "source_files": {f.name: f.stat().st_size for f in safetensors_files(src)}}
    marker = dst / _PERTURB_MARKER
    if marker.exists() and json.loads(marker.read_text()) == recipe:
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != _PERTURB_MARKER:
            shutil.copy2(f, dst / f.name)
    for f in safetensors_files(src):
        tensors = {}
        for name, w in iter_safetensors(f):
            if include in name and w.ndim == 2 and w.is_floating_point():
                g = torch.Generator().manual_seed(int(seed) * 1_000_003 + zlib.crc32(name.encode()))
                noise = torch.randn(w.shape, generator=g, dtype=torch.float32)
                w = (w.float() * (1.0 + sigma * noise)).to(w.dtype)
            tensors[name] = w.contiguous()
        save_file(tensors, str(dst / f.name), metadata={"format": "pt"})
    marker.write_text(json.dumps(recipe, indent=1))
    return dst


__all__ = ["checkpoint_checksums", "checkpoint_names", "iter_safetensors", "perturbed_checkpoint", "resolve_source",
           "safetensors_files", "write_state_dict"]
