"""Workloads against live servers: your prompts at each concurrency, spec on vs off, the tail not the mean.

For each concurrency c (outer loop) and each server (inner loop: the servers interleave, so a drift in the
machine hits both) the prompts are sent ``repeats`` times with at most c in flight. /metrics is read before and
after each config (exact acceptance) and polled while it runs (the batch the engine really ran). A server that
dies mid-workload ends the run with one clear error; every row measured before it is kept and exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorer.engine.allow import EnginePolicy, check_url
from explorer.engine.client import RequestRecord, is_connection_error, make_client, served_model, stream_request
from explorer.engine.counters import MetricsSnapshot, SpecCounters, scrape
from explorer.errors import ExplorerError
from explorer.measure.metrics import percentile
from explorer.measure.workload import Prompt

MAX_CONCURRENCY = 256


@dataclass
class Target:
    label: str
    url: str
    model: str = ""
    chat: bool = False


@dataclass
class ConfigResult:
    label: str
    url: str
    concurrency: int
    records: list[RequestRecord] = field(default_factory=list)
    wall_s: float = 0.0
    spec: SpecCounters | None = None  # the /metrics difference over this config; None: unavailable
    running: list[float] = field(default_factory=list)  # vllm:num_requests_running, polled
    busy_s: float | None = None  # the /metrics difference of the requests' scheduled seconds; None: unavailable
    aborted: str | None = None

    def summary(self) -> dict[str, object]:
        ok = [r for r in self.records if r.error is None]
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
        itl = [g for r in ok for g in r.itl_s]
        tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
        tokens = sum(r.tokens for r in ok)
        steps = sum(len(r.bursts) for r in ok)
        row: dict[str, object] = {"label": self.label, "concurrency": self.concurrency, "requests": len(self.records),
                                  "errors": len(self.records) - len(ok), "tokens": tokens, "wall_s": self.wall_s,
                                  "throughput_tok_s": tokens / self.wall_s if self.wall_s > 0 else math.nan}
        for name, values in (("ttft", ttft), ("itl", itl), ("tpot", tpot), ("e2e", e2e)):
            for q in (50, 95, 99):
                row[f"{name}_p{q}_ms"] = percentile(values, q) * 1000 if values else math.nan
        row["mean_running"] = float(np.mean(self.running)) if self.running else math.nan
        row["max_running"] = float(np.max(self.running)) if self.running else math.nan
        row["max_streaming"] = max_streaming(ok)
        # Little's law on the engine's own clock: the seconds requests spent scheduled, summed, over the wall time.
        # Nothing is polled, so a config shorter than a poll is still seen; a serial engine stays <= 1.
        row["engine_batch"] = self.busy_s / self.wall_s if self.busy_s is not None and self.wall_s > 0 else math.nan
        row["tokens_per_chunk_inferred"] = (tokens - len(ok)) / steps if steps else math.nan  # first chunks excluded
        row["accepted_inferred"] = sum(r.inferred_accepted for r in ok)
        if self.spec is not None:
            row["acceptance"] = self.spec.acceptance if self.spec.acceptance is not None else math.nan
            row["tokens_per_step"] = self.spec.tokens_per_step if self.spec.tokens_per_step is not None else math.nan
            row["accepted_metrics"] = self.spec.accepted
            row["drafts_metrics"] = self.spec.drafts
            row["acceptance_by_position"] = " ".join(f"{a:.2f}" for a in self.spec.position_acceptance())
        else:
            row["acceptance"] = "unavailable"
        row["aborted"] = self.aborted or ""
        return row


def max_streaming(records: Sequence[RequestRecord]) -> int:
    """The most requests whose token streams (first to last token, on the client's clock) overlapped at one
    moment: >= 2 means the engine interleaved their decoding (a serial engine finishes one stream before the
    next one's first token). Unlike the polled gauge, it cannot miss a short config between two polls."""
    events = []
    for r in records:
        ts = [c.t for c in r.chunks if c.tokens > 0]
        if len(ts) >= 2:
            events += [(r.sent + ts[0], 1), (r.sent + ts[-1], -1)]
    best = now = 0
    for _, step in sorted(events):  # at equal times -1 sorts first: touching streams do not overlap
        now += step
        best = max(best, now)
    return best


@dataclass
class EngineBench:
    configs: list[ConfigResult] = field(default_factory=list)
    error: str | None = None  # why the run ended early (the rows before it are kept)

    @property
    def records(self) -> list[RequestRecord]:
        return [r for c in self.configs for r in c.records]


async def _poll(url: str, into: list[float], stop: asyncio.Event, every_s: float,
                policy: EnginePolicy | None = None) -> None:
    while not stop.is_set():
        snap = await asyncio.to_thread(scrape, url, 2.0, policy)
        if snap is not None and snap.running is not None:
            into.append(snap.running)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def run_config(target: Target, prompts: Sequence[Prompt], concurrency: int, repeats: int, max_tokens: int,
                     temperature: float, on_record: Callable[[RequestRecord], None] | None = None,
                     poll_s: float = 0.1, ignore_eos: bool = False,
                     cancel: threading.Event | None = None, policy: EnginePolicy | None = None) -> ConfigResult:
    """Every prompt ``repeats`` times, at most ``concurrency`` in flight; /metrics before and after. A ``policy``
    (the Engine tab's) limits where every request may go."""
    result = ConfigResult(target.label, target.url, concurrency)
    before = await asyncio.to_thread(scrape, target.url, 5.0, policy)
    jobs = [(rep, p) for rep in range(repeats) for p in prompts]
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    client = make_client(target.url, policy=policy)
    stop_poll = asyncio.Event()
    dead = asyncio.Event()

    async def worker() -> None:
        while not queue.empty() and not dead.is_set() and not (cancel and cancel.is_set()):
            rep, prompt = queue.get_nowait()
            record = RequestRecord(target.label, target.url, prompt.id, concurrency, rep, time.time())
            temp = prompt.temperature if prompt.temperature is not None else temperature
            await stream_request(client, record, target.model, prompt.text, max_tokens, temp, target.chat,
                                 ignore_eos=ignore_eos, seed=rep)
            result.records.append(record)
            if on_record is not None:
                on_record(record)
            if is_connection_error(record):
                dead.set()

    poller = asyncio.create_task(_poll(target.url, result.running, stop_poll, poll_s, policy)) if before else None
    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(jobs)))))
    finally:
        result.wall_s = time.perf_counter() - t0
        stop_poll.set()
        if poller is not None:
            await poller
        await client.close()
    if dead.is_set():
        first = next(r for r in result.records if is_connection_error(r))
        result.aborted = f"{target.label} ({target.url}) stopped answering: {first.error}"
    elif cancel is not None and cancel.is_set():
        result.aborted = "cancelled"
    after = await asyncio.to_thread(scrape, target.url, 5.0, policy)
    if before is not None and after is not None and after.spec is not None:
        result.spec = after.spec.minus(before.spec)
    if before is not None and after is not None and None not in (before.busy_s, after.busy_s):
        result.busy_s = after.busy_s - before.busy_s
    return result


def resolve_targets(urls: Sequence[tuple[str, str]], chat: bool | None = None,
                    policy: EnginePolicy | None = None) -> list[Target]:
    """(label, url) pairs -> Targets with the served model; one clear error for a URL nobody answers (or, with a
    ``policy``, that it does not allow)."""
    targets = []
    for label, url in urls:
        what = f"the URL of {label!r}"
        url = check_url(url, what) if policy is None else policy.check_url(url, what)
        targets.append(Target(label, url, served_model(url, policy=policy), bool(chat)))
    return targets


def check_concurrency(values: Sequence[int], limit: int = MAX_CONCURRENCY) -> list[int]:
    if not values or any(not 1 <= c <= limit for c in values):
        raise ExplorerError(f"concurrency values must be in 1..{limit} (got {list(values)})")
    return list(values)


def parse_concurrency(text: str, limit: int = MAX_CONCURRENCY) -> list[int]:
    """"1,2,4" -> [1, 2, 4], each in 1..limit (the CLI's --concurrency and the Engine tab's box)."""
    try:
        values = [int(x) for x in (text or "").replace(" ", "").split(",") if x]
    except ValueError:
        raise ExplorerError(f"concurrency: comma-separated whole numbers such as 1,2,4 (got {text!r})") from None
    return check_concurrency(values, limit)


def run_bench(targets: Sequence[Target], prompts: Sequence[Prompt], concurrencies: Sequence[int], repeats: int = 1,
              max_tokens: int = 64, temperature: float = 0.0, on_record: Callable[[RequestRecord], None] | None = None,
              on_config: Callable[[ConfigResult], None] | None = None, ignore_eos: bool = False,
              cancel: threading.Event | None = None, warmup: bool = True,
              policy: EnginePolicy | None = None) -> EngineBench:
    """Concurrency outer, servers inner (interleaved), after one unmeasured warm-up burst per server. Stops at the
    first server that stops answering."""
    check_concurrency(concurrencies)
    if repeats < 1:
        raise ExplorerError(f"--repeats must be >= 1 (got {repeats})")
    if not prompts:
        raise ExplorerError("no prompts to send")
    bench = EngineBench()
    for target in targets if warmup else ():  # compile and cache warm-up, at the largest batch, not measured
        asyncio.run(run_config(target, prompts[:1], max(concurrencies), max(concurrencies), 8, temperature,
                               poll_s=60.0, policy=policy))
    for c in concurrencies:
        for target in targets:
            result = asyncio.run(run_config(target, prompts, c, repeats, max_tokens, temperature, on_record,
                                            ignore_eos=ignore_eos, cancel=cancel, policy=policy))
            bench.configs.append(result)
            if on_config is not None:
                on_config(result)
            if result.aborted:
                bench.error = result.aborted
                return bench
    return bench


# ---------------------------------------------------------------------------------------------
# tables

def summary_rows(bench: EngineBench, baseline: str | None = None) -> list[dict[str, object]]:
    """One row per (server, concurrency); with a baseline label, each other server's gain over it."""
    rows = [c.summary() for c in bench.configs]
    if baseline is not None:
        base = {r["concurrency"]: r for r in rows if r["label"] == baseline}
        for r in rows:
            b = base.get(r["concurrency"])
            if r["label"] == baseline or b is None:
                continue
            r["speedup_throughput"] = _ratio(r["throughput_tok_s"], b["throughput_tok_s"])
            r["speedup_p50_latency"] = _ratio(b["e2e_p50_ms"], r["e2e_p50_ms"])
            r["speedup_p99_latency"] = _ratio(b["e2e_p99_ms"], r["e2e_p99_ms"])
            r["p99_itl_vs_baseline"] = _ratio(r["itl_p99_ms"], b["itl_p99_ms"])
    return rows


def _ratio(a: object, b: object) -> float:
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return math.nan
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def write_csv(path: str | Path, bench: EngineBench) -> Path:
    """Every request row (the ones before an abort too)."""
    path = Path(path)
    rows = [r.row() for r in bench.records]
    if not rows:
        path.write_text("")
        return path
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def snapshot_label(snap: MetricsSnapshot | None) -> str:
    if snap is None:
        return "no /metrics"
    if snap.spec is None:
        return "vLLM, no speculative decoding" if snap.is_vllm else "metrics without speculative counters"
    return "vLLM with speculative decoding"
