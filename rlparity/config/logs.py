"""Where the engines' log lines go: a file, so terminals and published notebooks show rlparity's
output (progress, summaries, verdicts) and not vLLM's start-up chatter.

:func:`engine_logs_to_file` only records the choice (the CLI and :func:`rlparity.plot.init_notebook`
call it first thing); it creates nothing. Each engine start then enters :func:`engine_logging`, which
creates the log folder and a logging config of its own (``rlparity-vllm-logging-*.json`` in the temp
folder), names it to vLLM for that engine's lifetime only, and removes it when the engine shuts down.
So a command that starts no engine writes nothing, and no later engine depends on a file an earlier
one made.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

QUIET_ENV = {
    "TORCH_CPP_LOG_LEVEL": "ERROR",                                 # torch's C++ warnings (NUMA binding, ...)
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",  # in the engine's own processes
    "VLLM_LOGGING_COLOR": "0",
}
# vLLM configures its logging when imported; outside an engine (e.g. an audit that only resolves a
# command line) it then stays silent below WARNING instead of printing to stdout
_OUTSIDE_ENGINES = {"VLLM_CONFIGURE_LOGGING": "0"}
_CHOICE: dict[str, Path | None] = {"file": None}
_OURS: set[str] = set()  # environment variables this module set (a second call keeps its choice)


def engine_logs_to_file(log_dir: str | os.PathLike, *, show: bool = False) -> Path | None:
    """Choose to send vLLM's log lines to a file.

    Every process an engine starts logs to ``log_dir/vllm-<timestamp>-<pid>.log``, with torch's C++
    and Python warnings quieted there. Nothing is created until an engine starts
    (:func:`engine_logging`). Values the user already set win (``VLLM_LOGGING_CONFIG_PATH`` or
    ``VLLM_CONFIGURE_LOGGING`` set: logging is left alone).

    Parameters
    ----------
    log_dir : str or os.PathLike
        The folder of the log file (made when an engine starts).
    show : bool, default False
        Send the lines to stderr instead (a ``--engine-logs`` flag).

    Returns
    -------
    Path or None
        The chosen log file; ``None`` with ``show`` or where the user's logging settings win.
    """
    if show:
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        if "VLLM_CONFIGURE_LOGGING" in _OURS:  # an earlier choice in this process silenced vLLM
            del os.environ["VLLM_CONFIGURE_LOGGING"]
            _OURS.discard("VLLM_CONFIGURE_LOGGING")
        _CHOICE["file"] = None
        return None
    if any(k in os.environ and k not in _OURS for k in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING")):
        return None
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_file = Path(log_dir) / f"vllm-{stamp}-{os.getpid()}.log"
    with contextlib.suppress(OSError):  # the working directory may be gone
        log_file = Path(os.path.abspath(log_file))
    _CHOICE["file"] = log_file
    for k, v in {**QUIET_ENV, **_OUTSIDE_ENGINES}.items():
        if k not in os.environ:
            os.environ[k] = v
            _OURS.add(k)
    return log_file


def _config(log_file: Path) -> dict:
    return {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log_file), "formatter": "plain",
                              "delay": True, "level": "DEBUG"}},
        "loggers": {"vllm": {"handlers": ["file"], "level": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
                             "propagate": False}},
    }


@contextlib.contextmanager
def engine_logging() -> Iterator[dict[str, str]]:
    """For one engine's lifetime: yield the environment that sends its log lines to the chosen file
    (empty when :func:`engine_logs_to_file` chose none). The log folder is made here, and the logging
    config is a temporary file of this engine start, removed when the block ends (the engine's
    shutdown). A log folder that cannot be made is an ``OSError`` saying how to go on."""
    log_file = _CHOICE["file"]
    if log_file is None or os.environ.get("VLLM_LOGGING_CONFIG_PATH"):
        yield {}
        return
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(f"cannot create the folder for vLLM's log lines {log_file.parent} ({err.strerror}): run from a "
                      "writable folder where 'runs' is not a file, or pass --engine-logs to show them on "
                      "stderr") from None
    fd, cfg = tempfile.mkstemp(prefix="rlparity-vllm-logging-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_config(log_file), fh)
        yield {"VLLM_LOGGING_CONFIG_PATH": cfg, "VLLM_CONFIGURE_LOGGING": "1"}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(cfg)


def subprocess_logging_env() -> dict[str, str]:
    """The environment of an engine in a process of its own that keeps its own log (``vllm serve``).

    It undoes the silencing :func:`engine_logs_to_file` applies to vLLM imports outside engines.

    Returns
    -------
    dict[str, str]
        ``{"VLLM_CONFIGURE_LOGGING": "1"}`` when a log file was chosen; else empty.
    """
    return {"VLLM_CONFIGURE_LOGGING": "1"} if _CHOICE["file"] is not None else {}


def progress_log(message: str) -> None:
    """The default ``log`` of the experiment runners: one progress line, to the log file.

    The line ("engine started in 28.3 s", one per arm) is appended to the log file
    :func:`engine_logs_to_file` chose (a notebook's page then shows results, not a box per progress
    line), or to stderr where no file was chosen (``show``, or logging left to the user). A file
    that cannot be written sends the line to stderr.

    Parameters
    ----------
    message : str
        The progress line.
    """
    import sys

    log_file = _CHOICE["file"]
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            with open(log_file, "a") as fh:
                fh.write(f"{dt.datetime.now():%Y-%m-%d %H:%M:%S} {os.getpid()} INFO rlparity: {message}\n")
            return
        except OSError:
            pass
    print(message, file=sys.stderr, flush=True)


def default_log_dir() -> Path:
    """Where notebooks' engine logs go.

    Returns
    -------
    Path
        ``$RLPARITY_CACHE/logs`` (default ``~/.cache/rlparity/logs``).
    """
    return Path(os.environ.get("RLPARITY_CACHE", Path.home() / ".cache" / "rlparity")) / "logs"


__all__ = ["QUIET_ENV", "default_log_dir", "engine_logging", "engine_logs_to_file", "progress_log",
           "subprocess_logging_env"]
