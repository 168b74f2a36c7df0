"""Streamed completions from an OpenAI-compatible server (the ``openai`` client), one timestamp per chunk.

With speculative decoding on, vLLM sends one chunk per engine step, so a chunk of k tokens is a step that
accepted k - 1 drafts. That reading is *inferred from the stream* (a slow reader can get two steps merged in
one chunk); /metrics (``metrics.py``) has the exact counts. Tokens per chunk come from vLLM's per-chunk usage
(``continuous_usage_stats``); a server without it is counted one token per non-empty chunk, and says so.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import openai

from explorer.engine.allow import EnginePolicy
from explorer.errors import ExplorerError


@dataclass
class Chunk:
    t: float  # seconds after the request was sent
    tokens: int  # new tokens in this chunk
    text: str


@dataclass
class RequestRecord:
    label: str
    url: str
    prompt_id: str
    concurrency: int
    repeat: int
    sent: float  # time.time() when sent (wall clock, for the over-time plots)
    chunks: list[Chunk] = field(default_factory=list)
    done: float | None = None  # seconds after sending when the stream ended
    error: str | None = None
    token_counts: str = "usage"  # "usage" (the server's) or "chunks" (one per non-empty chunk: no usage sent)
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # only when asked for (cross-checks)

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.chunks)

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def ttft_s(self) -> float | None:
        first = next((c for c in self.chunks if c.tokens > 0), None)
        return first.t if first else None

    @property
    def e2e_s(self) -> float | None:
        return self.done

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive chunks that carried tokens (what a reader waits between updates)."""
        ts = [c.t for c in self.chunks if c.tokens > 0]
        return [b - a for a, b in zip(ts, ts[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        """(end-to-end - TTFT) / (tokens - 1): time per output token after the first."""
        if self.done is None or self.ttft_s is None or self.tokens < 2:
            return None
        return (self.done - self.ttft_s) / (self.tokens - 1)

    @property
    def bursts(self) -> list[int]:
        """Tokens of each chunk after the first (the first is the prefill's token): one engine step each."""
        sizes = [c.tokens for c in self.chunks if c.tokens > 0]
        return sizes[1:]

    @property
    def inferred_accepted(self) -> int:
        """Drafts accepted, inferred from the stream: sum over steps of (tokens in the chunk - 1)."""
        return sum(k - 1 for k in self.bursts)

    def row(self) -> dict[str, object]:
        itl = self.itl_s
        return {"label": self.label, "url": self.url, "concurrency": self.concurrency, "prompt_id": self.prompt_id,
                "repeat": self.repeat, "sent": self.sent, "ok": self.error is None, "error": self.error or "",
                "tokens": self.tokens, "chunks": len([c for c in self.chunks if c.tokens > 0]),
                "ttft_s": self.ttft_s, "e2e_s": self.e2e_s, "tpot_s": self.tpot_s,
                "itl_mean_s": sum(itl) / len(itl) if itl else None, "itl_max_s": max(itl) if itl else None,
                "inferred_accepted": self.inferred_accepted, "steps": len(self.bursts),
                "token_counts": self.token_counts, "finish_reason": self.finish_reason or ""}


def make_client(url: str, timeout_s: float = 120.0, policy: EnginePolicy | None = None) -> openai.AsyncOpenAI:
    """With a ``policy`` (the app's Engine tab) the client connects only where it allows and follows no redirect
    (the openai client's own follows them)."""
    timeout = httpx.Timeout(timeout_s, connect=5.0)
    return openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key="EMPTY", max_retries=0, timeout=timeout,
                              http_client=policy.async_client(timeout) if policy is not None else None)


def served_model(url: str, timeout_s: float = 5.0, policy: EnginePolicy | None = None) -> str:
    """The first model the server lists, or one clear error when nothing (OpenAI-compatible) answers there."""
    try:
        if policy is None:
            response = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s)
        else:
            with policy.client(timeout_s) as http:
                response = http.get(url.rstrip("/") + "/v1/models")
        if response.is_redirect:
            raise ExplorerError(f"{url} answered GET /v1/models with a redirect (HTTP {response.status_code}); "
                                "redirects are not followed: give the URL it redirects to")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except ExplorerError:  # refused by the policy, or a redirect: already one line (and a ValueError)
        raise
    except httpx.ConnectError:
        raise ExplorerError(f"nothing answers at {url} (connection refused); start one with "
                            "`python -m explorer engine start` or check the URL") from None
    except httpx.TimeoutException:
        raise ExplorerError(f"{url} did not answer within {timeout_s:.0f} s") from None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ExplorerError(f"{url} is not an OpenAI-compatible server (GET /v1/models: {exc})") from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return f"connection failed ({type(cause).__name__}: {cause})".strip()
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def is_connection_error(record: RequestRecord) -> bool:
    return bool(record.error) and record.error.startswith(("connection failed", "stream broke"))


async def stream_request(client: openai.AsyncOpenAI, record: RequestRecord, model: str, prompt: str | list[int],
                         max_tokens: int, temperature: float = 0.0, chat: bool = False, ignore_eos: bool = False,
                         seed: int | None = None, want_ids: bool = False) -> RequestRecord:
    """Send one streamed request; fill ``record`` chunk by chunk (errors land in ``record.error``)."""
    extra: dict[str, object] = {"ignore_eos": ignore_eos} if ignore_eos else {}
    if want_ids:
        extra["return_tokens_as_token_ids"] = True
    common = dict(model=model, max_tokens=max_tokens, temperature=temperature, stream=True, seed=seed,
                  stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body=extra or None)
    t0 = time.perf_counter()
    record.sent = time.time()
    seen_usage, last_total, ids = False, 0, []
    try:
        if chat:
            if not isinstance(prompt, str):
                raise ExplorerError("a chat request needs a text prompt")
            stream = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}],
                                                          logprobs=want_ids or None, **common)
        else:
            stream = await client.completions.create(prompt=prompt, logprobs=0 if want_ids else None, **common)
        async for event in stream:
            t = time.perf_counter() - t0
            choice = event.choices[0] if event.choices else None
            text = ""
            if choice is not None:
                text = (choice.delta.content or "") if chat else (choice.text or "")
                record.finish_reason = choice.finish_reason or record.finish_reason
                if want_ids:
                    ids += _ids_of(choice, chat)
            usage = getattr(event, "usage", None)
            if usage is not None and usage.completion_tokens is not None:
                seen_usage = True
                new = usage.completion_tokens - last_total
                last_total = usage.completion_tokens
            else:
                new = 1 if text else 0
            if choice is None and new == 0:
                continue  # the closing usage-only chunk
            record.chunks.append(Chunk(t, new, text))
        record.done = time.perf_counter() - t0
    except (openai.OpenAIError, httpx.HTTPError) as exc:
        record.error = _describe(exc)
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)) or "incomplete" in str(exc).lower():
            record.error = f"stream broke: {exc}"
    record.token_counts = "usage" if seen_usage else "chunks"
    if want_ids:
        record.token_ids = ids
    return record


def _ids_of(choice, chat: bool) -> list[int]:
    """Token ids from ``return_tokens_as_token_ids`` logprobs ("token_id:123")."""
    if chat:
        content = choice.logprobs.content if choice.logprobs else None
        tokens = [c.token for c in content or []]
    else:
        tokens = list(choice.logprobs.tokens or []) if choice.logprobs else []
    return [int(t.split(":", 1)[1]) for t in tokens if t.startswith("token_id:")]


def run_one(url: str, prompt: str | list[int], max_tokens: int = 64, temperature: float = 0.0, chat: bool = False,
            model: str | None = None, want_ids: bool = False, label: str = "",
            ignore_eos: bool = False, policy: EnginePolicy | None = None) -> RequestRecord:
    """One streamed request, synchronously (the CLI, the cross-checks, the Engine tab with its ``policy``)."""
    model = model or served_model(url, policy=policy)

    async def go() -> RequestRecord:
        client = make_client(url, policy=policy)
        try:
            record = RequestRecord(label or url, url, "p0", 1, 0, time.time())
            return await stream_request(client, record, model, prompt, max_tokens, temperature, chat,
                                        ignore_eos=ignore_eos, want_ids=want_ids)
        finally:
            await client.close()

    return asyncio.run(go())
