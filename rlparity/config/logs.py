"""Where the engines' log lines go: a file, so terminals and published notebooks show rlparity's
output (progress, summaries, verdicts) and not vLLM's start-up chatter.

vLLM configures its logging from the environment when it is imported, in every process it starts
(engine core, workers), so :func:`engine_logs_to_file` must run before vLLM is imported; the CLI
and :func:`rlparity.plot.init_notebook` call it first thing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path

QUIET_ENV = {
    "TORCH_CPP_LOG_LEVEL": "ERROR",                                 # torch's C++ warnings (NUMA binding, ...)
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",  # in the engine's own processes
    "VLLM_LOGGING_COLOR": "0",
}


def engine_logs_to_file(log_dir: str | os.PathLike, *, show: bool = False) -> Path | None:
    """Send vLLM's log lines (every process it starts) to ``log_dir/vllm-<timestamp>.log`` and
    quiet torch's C++ and Python warnings there; return the log file. With ``show`` (a ``--engine-logs``
    flag) nothing changes except that the lines go to stderr. Values the user already set win."""
    if show:
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        return None
    if "VLLM_LOGGING_CONFIG_PATH" in os.environ:
        return None
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_file = (log_dir / f"vllm-{stamp}-{os.getpid()}.log").resolve()
    config = {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log_file), "formatter": "plain",
                              "delay": True, "level": "DEBUG"}},
        "loggers": {"vllm": {"handlers": ["file"], "level": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
                             "propagate": False}},
    }
    fd, cfg = tempfile.mkstemp(prefix="rlparity-vllm-logging-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(config, fh)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = cfg
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)
    return log_file


def default_log_dir() -> Path:
    """``$RLPARITY_CACHE/logs`` (default ``~/.cache/rlparity/logs``): where notebooks' engine logs go."""
    return Path(os.environ.get("RLPARITY_CACHE", Path.home() / ".cache" / "rlparity")) / "logs"


__all__ = ["QUIET_ENV", "default_log_dir", "engine_logs_to_file"]
