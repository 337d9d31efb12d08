"""Capture through an OpenAI-compatible vLLM server, as PipelineRL runs it.

:class:`Server` starts a real ``python -m vllm.entrypoints.openai.api_server`` on loopback with
``--return-tokens-as-token-ids`` and the flags of an :class:`EngineSettings`; :class:`ServerClient`
talks to any running ``vllm serve`` (a URL). Both return traces with the same schema as
:meth:`rlparity.capture.Engine.capture`.

Every request is one ``POST /v1/completions`` with ``logprobs: 0`` (the sampled token's logprob
only: ``logprobs.token_logprobs``, never a top alternative) and ``return_token_ids: true`` (the
prompt ids the server tokenised and the sampled ids, cross-checked against the ``token_id:N``
strings that ``--return-tokens-as-token-ids`` makes of ``logprobs.tokens``). Sampling parameters
left "off" in :class:`SamplingSettings` (top-k, min-p, repetition penalty) are sent explicitly
with their neutral values, so a server running ``--generation-config auto`` samples what the
offline engine samples: the same ``SamplingParams`` as :meth:`SamplingSettings.to_vllm`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.capture.build import CaptureInfo, Completion, build_trace, capture_attrs
from rlparity.capture.engine_config import cpu_engine_kwargs, fit_to_model
from rlparity.capture.lifecycle import engine_env
from rlparity.capture.lock import engine_lock
from rlparity.capture.requests import Prompt, Request, make_requests, render_chat
from rlparity.config.env import scoped_env
from rlparity.config.logs import subprocess_logging_env
from rlparity.config.settings import EngineSettings, SamplingSettings

TOKEN_ID_PREFIX = "token_id:"
# vLLM's OpenAI layer clamps -inf logprobs to this JSON-safe value
OPENAI_NEG_INF = -9999.0
# sent explicitly so that --generation-config auto cannot change what a request samples
NEUTRAL_SAMPLING = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                    "presence_penalty": 0.0, "frequency_penalty": 0.0}


class ServerError(RuntimeError):
    """The server rejected a request or answered something rlparity cannot use.

    Parameters
    ----------
    message : str
        The one-line error.
    status : int, optional
        The HTTP status of the server's answer; ``None`` when there was none (unreachable server,
        unusable answer).
    """

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


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


def _error_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:2000]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in data:
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    return text.strip()[:2000]


def _http(method: str, url: str, body: Any = None, timeout: float = 600.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as err:
        msg = _error_message(err.read())
        raise ServerError(f"vLLM server {method} {url} failed with HTTP {err.code}: {msg}",
                          err.code) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout) as err:
        reason = getattr(err, "reason", err)
        raise ServerError(f"cannot reach the vLLM server at {url}: {reason}") from None
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------- client
class ServerClient:
    """Capture from an already running OpenAI-compatible vLLM server.

    >>> client = ServerClient("http://127.0.0.1:8000")
    >>> trace = client.capture(prompts, SamplingSettings(temperature=0.7, top_k=20))

    Parameters
    ----------
    base_url : str
        The server's URL (a trailing ``/`` or ``/v1`` is dropped).
    model : str, optional
        The served model name; ``None`` means the first one ``GET /v1/models`` lists.
    tokenizer : str, os.PathLike or tokenizer, optional
        A path or hub id (or a tokenizer object), loaded only for chat prompts, which are rendered
        with the chat template here and sent as token ids; ``None`` means the served model's root
        (else its name).
    max_workers : int, default 8
        Requests in flight at once (at least 1).
    timeout : float, default 600.0
        Seconds to wait for each HTTP answer.
    requested : dict, optional
        The engine settings asked for, recorded in the trace attrs (a :class:`Server` fills them
        from its settings).
    effective : dict, optional
        The engine's effective settings, recorded in the trace attrs (a :class:`Server` fills them
        from its command line); ``None``: only what ``/v1/models`` says is known.
    return_tokens_as_token_ids : bool, optional
        Whether the server was started with ``--return-tokens-as-token-ids``, when known (recorded
        in the trace attrs; every token is checked regardless).
    """

    backend = "vllm-server"

    def __init__(self, base_url: str, model: str | None = None, *, tokenizer: Any = None,
                 max_workers: int = 8, timeout: float = 600.0,
                 requested: dict[str, Any] | None = None,
                 effective: dict[str, Any] | None = None,
                 return_tokens_as_token_ids: bool | None = None):
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self._model = model
        self._tokenizer_src = tokenizer
        self._tokenizer: Any = None
        self.max_workers = max(1, int(max_workers))
        self.timeout = timeout
        self.requested = requested
        self._effective = effective
        self.return_tokens_as_token_ids = return_tokens_as_token_ids
        self._models: list[dict[str, Any]] | None = None

    # server facts -------------------------------------------------------------------
    def health(self, timeout: float = 5.0) -> bool:
        """Whether the server answers ``GET /health``.

        Parameters
        ----------
        timeout : float, default 5.0
            Seconds to wait for the answer.

        Returns
        -------
        bool
            ``True`` when it answered without an error.
        """
        try:
            _http("GET", f"{self.base_url}/health", timeout=timeout)
            return True
        except ServerError:
            return False

    def models(self) -> list[dict[str, Any]]:
        """The served models, as ``GET /v1/models`` lists them (asked once, then cached).

        Returns
        -------
        list of dict
            The ``data`` entries (``id``, ``root``, ``max_model_len``...); empty when the answer has none.

        Raises
        ------
        ServerError
            If the server cannot be reached or rejects the request.
        """
        if self._models is None:
            data = _http("GET", f"{self.base_url}/v1/models", timeout=self.timeout)
            self._models = list((data or {}).get("data", [])) if isinstance(data, dict) else []
        return self._models

    @property
    def model(self) -> str:
        """The served model name: the one given, else the first ``/v1/models`` lists (or a ``ServerError``)."""
        if self._model is None:
            served = self.models()
            if not served:
                raise ServerError(f"the server at {self.base_url} lists no model in /v1/models; "
                                  "pass model=...")
            self._model = str(served[0]["id"])
        return self._model

    def effective_config(self) -> dict[str, Any]:
        """What is known of the server's configuration.

        Returns
        -------
        dict
            The :class:`Server`'s resolved command line (the ``effective`` given), or for a foreign
            server the model, its ``max_model_len`` and root as ``/v1/models`` reports them.
        """
        if self._effective is not None:
            return dict(self._effective)
        eff: dict[str, Any] = {"model": self.model,
                               "effective_source": "GET /v1/models of a running server "
                                                   "(other engine settings are not exposed)"}
        for m in self.models():
            if m.get("id") == self.model:
                eff["max_model_len"] = m.get("max_model_len")
                if m.get("root"):
                    eff["model_root"] = m.get("root")
        return eff

    def tokenizer(self):
        """The tokenizer chat prompts are rendered with (loaded on first use).

        Returns
        -------
        transformers.PreTrainedTokenizerBase
            The tokenizer object given, else ``AutoTokenizer.from_pretrained`` of the path given or
            of the served model's root.
        """
        if self._tokenizer is None:
            src = self._tokenizer_src
            if src is not None and not isinstance(src, (str, os.PathLike)):
                self._tokenizer = src
            else:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(str(src or self._model_path()))
        return self._tokenizer

    def _model_path(self) -> str:
        for m in self.models():
            if m.get("id") == self.model and m.get("root"):
                return str(m["root"])
        return self.model

    # requests -----------------------------------------------------------------------
    def request_body(self, req: Request) -> dict[str, Any]:
        """The ``/v1/completions`` body for one request.

        The neutral values of the sampling parameters left off, then the request's sampling
        (:meth:`SamplingSettings.to_openai`), the model, the prompt (token ids where known, else text),
        ``logprobs: 0``, ``return_token_ids: true`` and ``stream: false``.

        Parameters
        ----------
        req : Request
            The request.

        Returns
        -------
        dict
            The JSON body.
        """
        body = {**NEUTRAL_SAMPLING, **req.sampling.to_openai(req.seed)}
        body.update({
            "model": self.model,
            "prompt": req.token_ids if req.token_ids is not None else req.text,
            "logprobs": 0,
            "return_token_ids": True,
            "stream": False,
        })
        return body

    def _post(self, req: Request) -> dict[str, Any]:
        try:
            out = _http("POST", f"{self.base_url}/v1/completions", self.request_body(req),
                        timeout=self.timeout)
        except ServerError as err:
            raise ServerError(f"request {req.index}: {err}", err.status) from None
        if not isinstance(out, dict) or "choices" not in out:
            raise ServerError(f"request {req.index}: the server answered no completion: {out!r:.500}")
        return out

    def _completions(self, req: Request, out: dict[str, Any], policy_version: int,
                     prompt_ids_fallback) -> list[Completion]:
        choices = sorted(out["choices"], key=lambda c: int(c.get("index", 0)))
        if len(choices) != req.sampling.n:
            raise ServerError(f"request {req.index}: asked for n={req.sampling.n} samples, the server "
                              f"returned {len(choices)}")
        result = []
        for j, ch in enumerate(choices):
            lp = ch.get("logprobs")
            if not lp or lp.get("tokens") is None or lp.get("token_logprobs") is None:
                raise ServerError(f"request {req.index}: the server returned no logprobs "
                                  "(the request sets logprobs=0; is this a vLLM server?)")
            tokens, logprobs = lp["tokens"], lp["token_logprobs"]
            bad = [t for t in tokens if not (isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX))]
            if bad:
                raise ServerError(
                    f"request {req.index}: logprobs.tokens are text ({bad[0]!r}), not "
                    f"'{TOKEN_ID_PREFIX}N': start the server with --return-tokens-as-token-ids, "
                    "otherwise tokens that do not decode to valid text cannot be identified")
            ids = [int(t[len(TOKEN_ID_PREFIX):]) for t in tokens]
            if len(logprobs) != len(ids) or any(v is None for v in logprobs):
                raise ServerError(f"request {req.index}: {len(ids)} tokens but logprobs "
                                  f"{logprobs!r:.200}")
            returned = ch.get("token_ids")
            if returned is not None and [int(t) for t in returned] != ids:
                raise ServerError(f"request {req.index}: token_ids {returned[:8]}... differ from the "
                                  f"ids in logprobs.tokens {ids[:8]}...")
            prompt_ids = ch.get("prompt_token_ids")
            if prompt_ids is None:
                prompt_ids = req.token_ids if req.token_ids is not None else prompt_ids_fallback(req)
            vals = [-math.inf if float(v) <= OPENAI_NEG_INF else float(v) for v in logprobs]
            result.append(Completion(req, j, [int(t) for t in prompt_ids], ids, vals,
                                     str(ch.get("finish_reason") or "unknown"), ch.get("text") or "",
                                     [policy_version] * len(ids)))
        return result

    def _tokenize_text(self, req: Request) -> list[int]:
        # only for servers that do not return prompt_token_ids: the server's own tokenisation
        out = _http("POST", f"{self.base_url}/tokenize", {"model": self.model, "prompt": req.text},
                    timeout=self.timeout)
        return [int(t) for t in out["tokens"]]

    def capture(self, prompts: Sequence[Prompt] | Prompt,
                sampling: SamplingSettings | Sequence[SamplingSettings] | None = None,
                *, arm: str = "default", progress: bool = True,
                policy_version: int = 0) -> xr.Dataset:
        """Sample every prompt through the server and return a rollout trace (no trainer side).

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
            The trace (:func:`rlparity.capture.build.build_trace`); logprobs the server clamped to
            -9999 are read as ``-inf``.

        Raises
        ------
        ServerError
            If a request fails, or an answer lacks logprobs, has text tokens (the server runs without
            ``--return-tokens-as-token-ids``), the wrong number of samples or inconsistent token ids.
        """
        requests = make_requests(prompts, sampling or SamplingSettings())
        if any(r.messages is not None and r.token_ids is None for r in requests):
            render_chat(requests, self.tokenizer())
        model = self.model
        t0 = time.perf_counter()
        results: list[dict[str, Any] | None] = [None] * len(requests)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(requests), desc=f"server {self.base_url}", unit="req")
        try:
            with ThreadPoolExecutor(max_workers=min(self.max_workers, len(requests))) as pool:
                futures = {pool.submit(self._post, r): k for k, r in enumerate(requests)}
                try:
                    for fut in as_completed(futures):
                        results[futures[fut]] = fut.result()
                        if bar is not None:
                            bar.update(1)
                except BaseException:
                    for f in futures:
                        f.cancel()
                    raise
        finally:
            if bar is not None:
                bar.close()
        elapsed = time.perf_counter() - t0
        completions: list[Completion] = []
        for req, out in zip(requests, results):
            assert out is not None
            completions += self._completions(req, out, policy_version, self._tokenize_text)
        info = CaptureInfo(self.backend, dict(self.requested or {}), self.effective_config(), {
            "server_url": self.base_url,
            "served_model": model,
            "return_tokens_as_token_ids": True,  # checked on every token above
            "server_started_with_return_tokens_as_token_ids": self.return_tokens_as_token_ids,
            "request_extras": {**NEUTRAL_SAMPLING, "logprobs": 0, "return_token_ids": True},
            "generate_s": round(elapsed, 3),
        })
        model_ref = self._model_path()
        return build_trace(completions, attrs=capture_attrs(info, model_ref, requests, arm))


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
        """A :class:`ServerClient` for this running server (a ``ServerError`` when it is not running)."""
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


__all__ = ["Server", "ServerClient", "ServerError", "free_port"]
