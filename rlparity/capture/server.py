"""Capture through an OpenAI-compatible vLLM server, as PipelineRL runs it.

:class:`Server` starts a real ``python -m vllm.entrypoints.openai.api_server`` on loopback with
``--return-tokens-as-token-ids`` and the flags of an :class:`~rlparity.config.settings.EngineSettings`, and captures through
a :class:`~rlparity.capture.server_client.ServerClient`, the client that also talks to any running
``vllm serve`` (a URL). Both return traces with the same schema as
:meth:`rlparity.capture.Engine.capture`; what each request asks for is described in
:mod:`rlparity.capture.server_client`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.capture.engine_config import cpu_engine_kwargs, fit_to_model
from rlparity.capture.lifecycle import engine_env
from rlparity.capture.lock import engine_lock
from rlparity.capture.requests import Prompt
from rlparity.capture.server_client import ServerClient, ServerError
from rlparity.config.env import scoped_env
from rlparity.config.logs import subprocess_logging_env
from rlparity.config.settings import EngineSettings, SamplingSettings


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now.

    Parameters
    ----------
    host : str, default "127.0.0.1"
        The address to bind.

    Returns
    -------
    int
        A port the system just gave out (free now; another process may take it later).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------- server
class Server:
    """A real vLLM OpenAI-compatible server subprocess on loopback; a context manager.

    >>> with Server(model_path, EngineSettings(logprobs_mode="processed_logprobs")) as srv:
    ...     trace = srv.capture(prompts, SamplingSettings(temperature=0.7, top_k=20))

    The server holds the machine-wide engine lock while it lives (close any engine of this
    process first, or it waits forever). Its output goes to ``log_path``.

    Parameters
    ----------
    model : str or os.PathLike
        A Hugging Face model name or a local checkpoint directory.
    settings : EngineSettings, optional
        The engine's settings, passed as server flags; ``None`` means ``EngineSettings()``.
    port : int, optional
        The port; ``None`` picks a free one (:func:`free_port`).
    host : str, default "127.0.0.1"
        The address the server listens on.
    startup_timeout : float, default 600.0
        Seconds to wait for ``/health`` before giving up.
    extra_args : sequence of str, optional
        Further server flags, appended to the command line.
    log_dir : str or os.PathLike, optional
        Where ``server.log`` goes; ``None`` makes a temporary directory.

    Raises
    ------
    ValueError
        If the settings ask for ``capture_routing`` (the OpenAI API returns no routes).
    """

    backend = "vllm-server"

    def __init__(self, model: str | os.PathLike, settings: EngineSettings | None = None, *,
                 port: int | None = None, host: str = "127.0.0.1", startup_timeout: float = 600.0,
                 extra_args: Sequence[str] = (), log_dir: str | os.PathLike | None = None):
        self.model = str(model)
        self.settings = fit_to_model(self.model, settings or EngineSettings())
        if self.settings.capture_routing:
            raise ValueError("capture_routing is not supported through vllm serve (the OpenAI API returns no routes): "
                             "capture with rlparity.capture.Engine or AsyncEngine")
        self.host = host
        self._port = port
        self.startup_timeout = float(startup_timeout)
        self.extra_args = list(extra_args)
        self._log_dir = log_dir
        self.log_path: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._lock: contextlib.ExitStack | None = None
        self._client: ServerClient | None = None
        self._effective: dict[str, Any] | None = None
        self._cpu = cpu_engine_kwargs(self.settings)
        self.startup_s: float | None = None

    # command line -------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port the server listens on (a free one, picked on first use, when none was given)."""
        if self._port is None:
            self._port = free_port(self.host)
        return self._port

    @property
    def url(self) -> str:
        """The server's base URL, ``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def command_line(self) -> list[str]:
        """The server's argv (what :func:`rlparity.capture.audit.audit` parses).

        Returns
        -------
        list of str
            ``python -m vllm.entrypoints.openai.api_server`` with the model, host, port,
            ``--return-tokens-as-token-ids``, the CPU defaults, the settings' flags and ``extra_args``.
        """
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--host", self.host, "--port", str(self.port), "--return-tokens-as-token-ids"]
        if "gpu_memory_utilization" in self._cpu:
            args += ["--gpu-memory-utilization", str(self._cpu["gpu_memory_utilization"])]
        return args + self.settings.to_cli_args() + self.extra_args

    def env(self) -> dict[str, str]:
        """The environment the server process runs with.

        Returns
        -------
        dict of str to str
            This process's environment plus ``PYTHONUNBUFFERED``, the engine's variables
            (:func:`rlparity.capture.lifecycle.engine_env`) and the logging variables (its log: ``server.log``).
        """
        return {**os.environ, "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1"),
                **engine_env(self.settings), **subprocess_logging_env()}  # its log: server.log

    def effective_config(self) -> dict[str, Any]:
        """The configuration vLLM resolves from the command line (no second engine started).

        Returns
        -------
        dict
            :func:`rlparity.capture.audit.resolve_kwargs` of :meth:`command_line` (resolved once,
            then cached), with ``effective_source`` saying so.
        """
        if self._effective is None:
            from rlparity.capture.audit import parse_command_line, resolve_kwargs

            with scoped_env(engine_env(self.settings)):
                eff = resolve_kwargs(parse_command_line(self.command_line()))
            eff["effective_source"] = "resolved from the server command line by vLLM"
            self._effective = eff
        return dict(self._effective)

    # lifecycle ----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the server process was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, n: int = 60) -> str:
        """The last lines of the server's log.

        Parameters
        ----------
        n : int, default 60
            How many lines.

        Returns
        -------
        str
            The lines, or ``"(no server log)"`` before the server started.
        """
        if self.log_path is None or not self.log_path.exists():
            return "(no server log)"
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def start(self) -> Server:
        """Start the server (once) and wait until it is healthy; takes the engine lock first.

        Returns
        -------
        Server
            The server itself, running.

        Raises
        ------
        ServerError
            If the server exits before it is healthy, or is not healthy within ``startup_timeout``
            (the message ends with the log's last lines).
        EngineLockError
            If the engine lock cannot be taken.
        """
        if self._proc is not None:
            return self
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(engine_lock())
        try:
            log_dir = Path(self._log_dir) if self._log_dir else Path(tempfile.mkdtemp(prefix="rlparity-server-"))
            log_dir.mkdir(parents=True, exist_ok=True)
            self.log_path = log_dir / "server.log"
            cmd = self.command_line()
            t0 = time.perf_counter()
            with open(self.log_path, "wb") as log:
                log.write((" ".join(cmd) + "\n").encode())
                log.flush()
                self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, env=self.env(),
                                              start_new_session=True)
            self._wait_healthy(t0)
            self.startup_s = time.perf_counter() - t0
        except BaseException:
            self.close()
            raise
        return self

    def _wait_healthy(self, t0: float) -> None:
        client = ServerClient(self.url, self.model)
        while True:
            rc = self._proc.poll() if self._proc is not None else -1
            if rc is not None:
                raise ServerError(f"the vLLM server exited with code {rc} before it was healthy; "
                                  f"last lines of {self.log_path}:\n{self.log_tail()}")
            if client.health(timeout=2.0):
                return
            if time.perf_counter() - t0 > self.startup_timeout:
                raise ServerError(f"the vLLM server was not healthy after {self.startup_timeout:.0f} s "
                                  f"(GET {self.url}/health); last lines of {self.log_path}:\n"
                                  f"{self.log_tail()}")
            time.sleep(0.5)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and release the engine lock.

        Parameters
        ----------
        timeout : float, default 30.0
            Seconds to wait for the process after each signal.
        """
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
        if proc is not None:
            # the engine core is a child in the same session: make sure it is gone too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._client = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:  # at interpreter exit module globals may already be gone: never raise from here
            self.close(timeout=5.0)
        except Exception:  # noqa: BLE001
            pass

    # capture ------------------------------------------------------------------------
    @property
    def client(self) -> ServerClient:
        """A :class:`~rlparity.capture.server_client.ServerClient` for this running server (a ``ServerError`` when it is not running)."""
        if not self.running:
            raise ServerError("the server is not running: use `with Server(...)` or call start()")
        if self._client is None:
            self._client = ServerClient(self.url, self.model, tokenizer=self.model,
                                        requested=self.settings.model_dump(),
                                        effective=self.effective_config(),
                                        return_tokens_as_token_ids=True)
        return self._client

    def capture(self, prompts: Sequence[Prompt] | Prompt,
                sampling: SamplingSettings | Sequence[SamplingSettings] | None = None,
                *, arm: str = "default", progress: bool = True,
                policy_version: int = 0) -> xr.Dataset:
        """:meth:`ServerClient.capture` on this server; the trace records the start-up time.

        Parameters
        ----------
        prompts : Prompt or sequence of Prompt
            Text, chat messages or token ids (:func:`rlparity.capture.requests.normalize_prompts`).
        sampling : SamplingSettings or sequence of SamplingSettings, optional
            One setting for all prompts or one per prompt; ``None`` means ``SamplingSettings()``.
        arm : str, default "default"
            The arm's name, stored in the trace's attrs.
        progress : bool, default True
            Show a progress bar (one step per request).
        policy_version : int, default 0
            The policy version every token carries.

        Returns
        -------
        xarray.Dataset
            The trace, with ``startup_s`` and ``server_command_line`` in its attrs.

        Raises
        ------
        ServerError
            If the server is not running or a request fails.
        """
        ds = self.client.capture(prompts, sampling, arm=arm, progress=progress,
                                 policy_version=policy_version)
        ds.attrs["startup_s"] = None if self.startup_s is None else round(self.startup_s, 3)
        ds.attrs["server_command_line"] = self.command_line()
        return ds


__all__ = ["Server", "free_port"]
