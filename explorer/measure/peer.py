"""Peer comparison: transformers' ``generate`` on the same models, prompts and settings as the explorer."""

from __future__ import annotations

import contextlib
import sys
import time

import pandas as pd
import torch
import transformers
from tqdm import tqdm

import explorer
from explorer.decoding.api import encode_prompt
from explorer.decoding.config import DecodeConfig
from explorer.decoding.events import Trace
from explorer.measure.bench import BenchSettings
from explorer.measure.report import (
    Section,
    peer_figure,
)
from explorer.measure.workload import PromptSet
from explorer.runtime import Models, synchronize

# ---------------------------------------------------------------------------------------------
# peer comparison: transformers' generate on the same models and prompts

@contextlib.contextmanager
def _assistant_settings(draft: torch.nn.Module, gamma: int):
    """Make transformers draft exactly gamma tokens per step (no schedule, no confidence stop), then restore."""
    config = draft.generation_config
    saved = {k: getattr(config, k, None) for k in ("num_assistant_tokens", "num_assistant_tokens_schedule",
                                                   "assistant_confidence_threshold")}
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(config, k, v)


def peer_pairs(models: Models, gamma: int) -> list[tuple[str, str, dict, dict]]:
    """(pair, our method, our options, transformers generate kwargs)."""
    pairs = [("greedy", "autoregressive", {}, {})]
    if models.draft is not None:
        pairs.append(("draft model", "speculative", {"drafter": "model", "gamma": gamma},
                      {"assistant_model": models.draft}))
    pairs.append(("prompt lookup", "speculative", {"drafter": "prompt_lookup", "gamma": gamma},
                  {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": DecodeConfig().max_ngram}))
    return pairs


@torch.inference_mode()
def hf_generate(models: Models, prompt_ids: list[int], max_new_tokens: int, kwargs: dict) -> tuple[list[int], float]:
    """transformers' greedy generate (plain, assisted or prompt lookup); new token ids and seconds."""
    ids = torch.tensor([prompt_ids], device=models.device)  # (1, T)
    eos = models.tokenizer.eos_token_id
    pad = models.tokenizer.pad_token_id if models.tokenizer.pad_token_id is not None else eos
    synchronize(models.device)
    start = time.perf_counter()
    out = models.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, **kwargs)
    synchronize(models.device)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - start


def _ours(models: Models, method: str, prompt: str, options: dict) -> tuple[Trace, float]:
    synchronize(models.device)
    start = time.perf_counter()
    trace = explorer.decode(method, models, prompt, **options)
    synchronize(models.device)
    return trace, time.perf_counter() - start


def run_peer(models: Models, sets: list[PromptSet], s: BenchSettings) -> pd.DataFrame:
    """Ours and transformers', interleaved per request (order alternating by repeat), greedy, same prompt ids."""
    transformers.logging.set_verbosity_error()  # its notices about generation kwargs would cut the progress bar
    gamma = s.gamma or models.preset.gamma
    pairs = peer_pairs(models, gamma)
    base = {"max_new_tokens": s.max_new_tokens, "temperature": 0.0}
    first = sets[0].prompts[0].text
    first_ids = encode_prompt(models.tokenizer, first, models.preset.chat)[0]
    with _assistant_settings(models.draft, gamma) if models.draft is not None else contextlib.nullcontext():
        for _, method, options, kwargs in pairs:  # warm-up
            for _ in range(max(1, s.warmup)):
                _ours(models, method, first, {**base, **options})
                hf_generate(models, first_ids, s.max_new_tokens, kwargs)
        tasks = [(r, ps, p, pair) for r in range(s.repeats) for ps in sets for p in ps.prompts for pair in pairs]
        rows = []
        for repeat, prompt_set, prompt, (pair, method, options, kwargs) in tqdm(
                tasks, desc="peer", unit="pair", file=sys.stderr, disable=not s.progress, dynamic_ncols=True):
            prompt_ids = encode_prompt(models.tokenizer, prompt.text, models.preset.chat)[0]
            result = {}
            for impl in (["ours", "transformers"] if repeat % 2 == 0 else ["transformers", "ours"]):
                if impl == "ours":
                    trace, seconds = _ours(models, method, prompt.text, {**base, **options})
                    result[impl] = (trace.token_ids, seconds, trace.stats["acceptance_rate"])
                else:
                    result[impl] = (*hf_generate(models, prompt_ids, s.max_new_tokens, kwargs), None)
            for impl, (tokens, seconds, acceptance) in result.items():
                rows.append({"pair": pair, "implementation": impl, "prompt_set": prompt_set.name,
                             "prompt_id": prompt.id, "repeat": repeat, "latency_s": seconds, "new_tokens": len(tokens),
                             "tokens_per_s": len(tokens) / seconds, "acceptance_rate": acceptance,
                             "output_equal": tokens == result["ours"][0]})
    return pd.DataFrame(rows)


def peer_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per pair: total time of ours over theirs (and its inverse, the speed ratio), outputs equal k/n."""
    rows = []
    for pair, g in frame.groupby("pair", sort=False):
        ours, theirs = g[g["implementation"] == "ours"], g[g["implementation"] == "transformers"]
        rows.append({"pair": pair, "requests": len(ours), "ours_p50_s": ours["latency_s"].median(),
                     "transformers_p50_s": theirs["latency_s"].median(),
                     "time_ours_over_theirs": ours["latency_s"].sum() / theirs["latency_s"].sum(),
                     "speed_ratio_theirs_over_ours": theirs["latency_s"].sum() / ours["latency_s"].sum(),
                     "outputs_equal": f"{int(theirs['output_equal'].sum())}/{len(theirs)}",
                     "acceptance_rate_ours": ours["acceptance_rate"].mean()})
    return pd.DataFrame(rows)


def peer_section(models: Models, sets: list[PromptSet], s: BenchSettings) -> tuple[Section, pd.DataFrame]:
    frame = run_peer(models, sets, s)
    gamma = s.gamma or models.preset.gamma
    notes = [f"Greedy (temperature 0), max_new_tokens={s.max_new_tokens}, γ={gamma} on both sides (transformers: "
             "num_assistant_tokens=γ with the constant schedule and no confidence stop; prompt lookup "
             f"prompt_lookup_num_tokens=γ, max_matching_ngram_size={DecodeConfig().max_ngram}). Each request runs "
             "ours and theirs back to back, order alternating by repeat. Our time is the whole explorer.decode call "
             "(tokenizing, every event, the Trace); theirs is generate() on prepared ids.",
             "time_ours_over_theirs < 1 means ours is faster; speed_ratio = theirs / ours."]
    return Section("Peer comparison: transformers' generate", [peer_figure(frame)],
                   {"ours against transformers": peer_summary(frame)}, notes), frame
