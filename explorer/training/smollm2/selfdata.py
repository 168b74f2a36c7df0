"""Stage 3b: the diffusion partner's own answers, for self-distillation (dParallel, Chen et al. 2025).

Certainty forcing on the *target's* greedy answers flattened at about 1.2 tokens per pass (three runs in a
row): to commit position j + 1 before j the partner must foresee which of two near-tied tokens the target picks
at j. Its own answers are made of its own choices, so sharpening it on them asks it only to be sure of what it
would write anyway. The partner decodes training prompts the way the app runs it (int8 kernels, N = 64, blocks
of 8, K = N: one position a pass, its most careful schedule), greedy; an answer is kept when the target finds it
plausible (perplexity under the target at most ``max_ppl``) and it does not loop (distinct 3-grams at least
``min_distinct``), so the partner is not taught its own repetitions. Shards go to ``work/selfdata`` in the
compact format of the distillation data (``store.save_compact``), resumable shard by shard.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from explorer.decoding.config import DecodeConfig
from explorer.decoding.diffusion import decode_diffusion
from explorer.measure.workload import distinct_ngram_ratio, generative_perplexity
from explorer.training.smollm2.common import budget_seconds, load_rows, log_event
from explorer.training.smollm2.store import save_compact, shard_paths

SELF_FOLDER = "selfdata"
SHARD_ROWS = 32


def self_prompts(work: Path) -> list[dict]:
    """Distinct training prompts (from the distillation shards' greedy rows), in a fixed shuffled order."""
    seen, prompts = set(), []
    for r in load_rows(work):
        if r.get("temperature", 0.0) == 0.0 and r["id"] not in seen:
            seen.add(r["id"])
            prompts.append({"id": r["id"], "prompt_ids": r["prompt_ids"]})
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(2025)).tolist()
    return [prompts[i] for i in order]


def generate_self_data(work: Path, budget_min: float, part: int = 0, parts: int = 1, max_ppl: float = 8.0,
                       min_distinct: float = 0.85, tokens: int = 64, block: int = 8, models=None,
                       shard_rows: int = SHARD_ROWS, max_shards: int | None = None) -> dict:
    """Decode training prompts with the shipped partner (``models``: the default preset unless given) until the
    budget is spent; shard ``k`` holds what was kept of prompts ``k * shard_rows ..`` of ``self_prompts``, so
    parts and resumed runs never overlap; every run makes at least one shard (and at most ``max_shards``)."""
    budget = budget_seconds(budget_min)
    out = work / SELF_FOLDER
    out.mkdir(parents=True, exist_ok=True)
    if models is None:
        import explorer  # deferred: the app's loader (the preset at its default precision)

        models = explorer.load_models("smollm2-135m")
    prompts = self_prompts(work)
    cfg = DecodeConfig(max_new_tokens=tokens, steps=tokens, block_length=block)
    done = shard_paths(out)
    start, made, kept, answer_tokens, shards = time.time(), 0, 0, 0, 0
    for k in range(part, len(prompts) // shard_rows, parts):
        if k in done:
            continue
        if (time.time() - start > budget and shards) or (max_shards is not None and shards >= max_shards):
            break
        rows, t_shard, stats = [], time.time(), []
        for p in prompts[k * shard_rows:(k + 1) * shard_rows]:
            gen = decode_diffusion(models, p["prompt_ids"], cfg)
            try:
                while True:
                    next(gen)
            except StopIteration as stop:
                answer = stop.value.tokens
            made += 1
            ppl = generative_perplexity(models.target, p["prompt_ids"], answer)
            distinct = distinct_ngram_ratio(answer)
            distinct = 1.0 if math.isnan(distinct) else distinct  # under 3 tokens: nothing can loop
            stats.append([round(ppl, 2), round(distinct, 3), len(answer)])
            if ppl <= max_ppl and distinct >= min_distinct:
                rows.append({"id": p["id"], "prompt_ids": p["prompt_ids"], "answer_ids": answer, "temperature": 0.0})
        save_compact(out / f"shard_{k:05d}.npz", rows)  # even empty: a resumed run skips it
        shards += 1
        kept += len(rows)
        answer_tokens += sum(len(r["answer_ids"]) for r in rows)
        log_event(work, "selfdata", shard=k, made=len(stats), kept=len(rows), seconds=time.time() - t_shard,
                  ppl_distinct_len=stats)
        print(f"shard {k}: kept {len(rows)}/{len(stats)} in {time.time() - t_shard:.0f} s", flush=True)
    return {"shards": shards, "made": made, "kept": kept, "answer_tokens": answer_tokens,
            "seconds": time.time() - start}
