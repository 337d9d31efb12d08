"""Line-by-line JSONL reading with file:line errors (shared by the JSONL formats)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlparity.importers.errors import ImportFormatError


def iter_jsonl(file: Path, advance=lambda n: None) -> Iterator[tuple[int, Any]]:
    """Every non-blank line of a JSONL file, parsed, one line in memory at a time.

    Parameters
    ----------
    file : pathlib.Path
        The file.
    advance : callable, optional
        Called with each line's length in bytes (progress); the default does nothing.

    Yields
    ------
    tuple of (int, object)
        ``(line number, parsed value)``, numbered from 1.

    Raises
    ------
    ImportFormatError
        If a line is not JSON (or nested too deeply to parse), naming ``file:line``.
    """
    with open(file, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            advance(len(raw))
            if not raw.strip():
                continue
            try:
                yield lineno, json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                msg = getattr(err, "msg", str(err))
                col = getattr(err, "colno", None)
                cut = "; the line is cut short (was the file still being written?)" if not raw.endswith(b"\n") else ""
                raise ImportFormatError(
                    f"{file}:{lineno}: not valid JSON ({msg}{f' at column {col}' if col else ''}){cut}") from None
            except RecursionError:
                raise ImportFormatError(f"{file}:{lineno}: a JSON value nested too deeply to read (more than "
                                        f"{sys.getrecursionlimit()} levels): not a dump record; check what wrote "
                                        "this line") from None


def jsonl_files(path: Path, pattern: str) -> list[Path]:
    """The files of a JSONL dump: ``path`` itself, or the files under it that match ``pattern``.

    Parameters
    ----------
    path : pathlib.Path
        A file or a folder.
    pattern : str
        A glob pattern, matched recursively (``rglob``).

    Returns
    -------
    list of pathlib.Path
        The files in natural order (``step_2`` before ``step_10``).
    """
    from rlparity.importers.values import natural_key

    if path.is_file():
        return [path]
    return sorted((p for p in path.rglob(pattern) if p.is_file()), key=natural_key)
