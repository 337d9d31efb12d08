"""The client of an OpenAI-compatible vLLM server: :class:`ServerClient` captures from any running
``vllm serve`` (a URL) and returns traces with the same schema as
:meth:`rlparity.capture.Engine.capture` (:class:`rlparity.capture.server.Server` starts one and
captures through this client).

Every request is one ``POST /v1/completions`` with ``logprobs: 0`` (the sampled token's logprob
only: ``logprobs.token_logprobs``, never a top alternative) and ``return_token_ids: true`` (the
prompt ids the server tokenised and the sampled ids, cross-checked against the ``token_id:N``
strings that ``--return-tokens-as-token-ids`` makes of ``logprobs.tokens``). Sampling parameters
left "off" in :class:`~rlparity.config.settings.SamplingSettings` (top-k, min-p, repetition penalty) are sent explicitly
with their neutral values, so a server running ``--generation-config auto`` samples what the
offline engine samples: the same ``SamplingParams`` as :meth:`SamplingSettings.to_vllm`.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import xarray as xr

from rlparity.capture.build import CaptureInfo, Completion, build_trace, capture_attrs
from rlparity.capture.requests import Prompt, Request, make_requests, render_chat
from rlparity.config.settings import SamplingSettings

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
        The engine settings asked for, recorded in the trace attrs (a :class:`~rlparity.capture.server.Server` fills them
        from its settings).
    effective : dict, optional
        The engine's effective settings, recorded in the trace attrs (a :class:`~rlparity.capture.server.Server` fills them
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
            The :class:`~rlparity.capture.server.Server`'s resolved command line (the ``effective`` given), or for a foreign
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


__all__ = ["ServerClient", "ServerError"]
