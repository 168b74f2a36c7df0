"""A server's Prometheus /metrics, read with prometheus_client's own text parser.

vLLM counts speculative decoding exactly: ``vllm:spec_decode_num_drafts`` (engine steps that drafted),
``…_num_draft_tokens``, ``…_num_accepted_tokens`` and ``…_num_accepted_tokens_per_pos{position=…}``. The
difference of two snapshots is what a workload did. A server without them (speculation off, or not vLLM)
gives ``spec=None``: acceptance is then *unavailable*, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from explorer.engine.allow import EnginePolicy

SPEC = "vllm:spec_decode_"


@dataclass(frozen=True)
class SpecCounters:
    drafts: float  # engine steps (summed over requests) that carried drafts
    draft_tokens: float
    accepted: float
    per_position: dict[int, float] = field(default_factory=dict)  # accepted tokens at draft position i

    def minus(self, before: SpecCounters | None) -> SpecCounters:
        if before is None:
            return self
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted,
                            {k: v - before.per_position.get(k, 0.0) for k, v in self.per_position.items()})

    @property
    def acceptance(self) -> float | None:
        """Accepted / proposed draft tokens."""
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens an engine step that drafted emitted: accepted drafts + the target's own token."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    def position_acceptance(self) -> list[float]:
        """Share of drafting steps whose draft at position i was accepted (i = 0, 1, ...)."""
        if self.drafts <= 0:
            return []
        return [self.per_position[i] / self.drafts for i in sorted(self.per_position)]


@dataclass(frozen=True)
class MetricsSnapshot:
    spec: SpecCounters | None  # None: the server exports no speculative-decoding counters
    running: float | None  # vllm:num_requests_running (the batch the engine runs now)
    waiting: float | None
    is_vllm: bool
    busy_s: float | None = None  # vllm:request_inference_time_seconds_sum: seconds finished requests were scheduled


def parse_metrics(text: str) -> MetricsSnapshot:
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    is_vllm = False
    for family in text_string_to_metric_families(text):
        is_vllm |= family.name.startswith("vllm:")
        for sample in family.samples:
            if sample.name == SPEC + "num_accepted_tokens_per_pos_total":
                pos = int(sample.labels.get("position", -1))
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
            elif sample.name.startswith("vllm:") and not sample.name.endswith("_created"):
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    spec = None
    if SPEC + "num_drafts_total" in sums:
        spec = SpecCounters(sums[SPEC + "num_drafts_total"], sums.get(SPEC + "num_draft_tokens_total", 0.0),
                            sums.get(SPEC + "num_accepted_tokens_total", 0.0), per_pos)
    return MetricsSnapshot(spec, sums.get("vllm:num_requests_running"), sums.get("vllm:num_requests_waiting"),
                           is_vllm, sums.get("vllm:request_inference_time_seconds_sum"))


def scrape(url: str, timeout: float = 5.0, policy: EnginePolicy | None = None) -> MetricsSnapshot | None:
    """The server's /metrics, or None when it has none (404), redirects or cannot be read; with a ``policy`` (the
    Engine tab) only where it allows."""
    try:
        if policy is None:
            response = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout)
        else:
            with policy.client(timeout) as http:
                response = http.get(url.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return parse_metrics(response.text)
    except ValueError:  # not the Prometheus text format
        return None
