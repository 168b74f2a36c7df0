"""Stage 1: the target's own answers to the chat prompt mix, with its top-k log-probs (sequence-level
distillation data)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from explorer.training.prompts import ROUNDS, chat_prompts
from explorer.training.smollm2.common import (
    TOP_K,
    budget_seconds,
    chat_text,
    load_rows,
    load_target,
    log_event,
    target_folder,
)
from explorer.training.smollm2.engine_data import generate_shards
from explorer.training.smollm2.store import save_compact, shard_paths, shard_temperature


class FeatureRecorder:
    """Keeps the target body's final hidden states (after the norm) of every generation step, for the
    EAGLE head (``eagle.py`` would otherwise need a second, teacher-forced pass over each answer)."""

    def __init__(self, model):
        self.parts: list[torch.Tensor] = []
        self.handle = model.model.register_forward_hook(
            lambda module, args, output: self.parts.append(output.last_hidden_state.to(torch.float16)))

    def close(self) -> torch.Tensor:
        self.handle.remove()
        return torch.cat(self.parts, 1)  # (B, prompt + generated - 1, H)


class TopKRecorder:
    """A logits processor that keeps the teacher's top-k log-probs at each step and changes nothing.

    With greedy decoding, or sampling at temperature 1 with no top-k/top-p, transformers adds no
    other processor, so the scores seen here are the model's raw logits.
    """

    def __init__(self, k: int):
        self.k, self.values, self.ids = k, [], []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        values, ids = torch.log_softmax(scores.float(), dim=-1).topk(self.k, dim=-1)  # (B, k)
        self.values.append(values.to(torch.float16))
        self.ids.append(ids.to(torch.int32))
        return scores


def prompt_chunks(batch: int, seed: int = 0, rounds: int = len(ROUNDS)) -> list[list[dict]]:
    """The shards' prompts, in shard order: each round of wordings (``prompts.ROUNDS``) cut into batches of its
    own, so adding a round appends shards and leaves every earlier shard as it was."""
    chunks = []
    for r in range(1, rounds + 1):
        this = chat_prompts("train", seed=seed, rounds=r)[len(chat_prompts("train", seed=seed, rounds=r - 1))
                                                          if r > 1 else 0:]
        chunks += [this[i:i + batch] for i in range(0, len(this), batch)]
    return chunks


def generate_data(work: Path, budget_min: float, batch: int = 32, max_new: int = 256, seed: int = 0,
                  part: int = 0, parts: int = 1, rounds: int = len(ROUNDS), engine: str = "torch",
                  cores: str = "0") -> dict:
    """Append compact shards (prompt and answer ids, ``store.save_compact``) until the budget or the prompts
    run out. (Shards made before the compact form also hold the teacher's top-k log-probs.)

    The target's final hidden states along each prompt + answer are kept beside it (work/eagle/feats)
    for the EAGLE head. Shard ``i`` holds the ``i``-th batch of ``prompt_chunks`` (fixed order), so a run
    resumes at the first missing shard. Even shards are greedy, odd shards temperature 1.
    ``engine="vllm"`` makes the same shards with vLLM's CPU engine (``engine_data.py``) on ``cores``, without
    the features (the eagle stage extracts them).
    """
    budget = budget_seconds(budget_min)
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    chunks = prompt_chunks(batch, seed, rounds)
    n_shards = len(chunks)
    start, made, tokens = time.time(), 0, 0
    # ``parts`` processes can share the work: process ``part`` takes shard pairs (greedy, T=1) p, p+parts...
    have = shard_paths(data)
    todo = [i for i in range(n_shards) if (i // 2) % parts == part and i not in have]
    if engine == "vllm":  # vLLM loads the weights itself: only the folder and the tokenizer here
        from transformers import AutoTokenizer  # deferred: transformers auto classes (~0.4 s to import)

        folder = target_folder(work)
        tok = AutoTokenizer.from_pretrained(folder)
        bar = tqdm(total=len(todo), desc="data on vLLM (shards)")

        def done(i: int, n: int) -> None:
            bar.update(1)
            log_event(work, "data", shard=i, answer_tokens=n, engine="vllm")

        info = generate_shards(data, folder, [(i, chunks[i]) for i in todo],
                               lambda text: tok(chat_text(tok, text))["input_ids"], tok.eos_token_id, budget,
                               max_new=max_new, seed=seed, cores=cores, on_shard=done)
        info["answer_tokens_total"] = sum(len(r["answer_ids"]) for r in load_rows(work))
        print(json.dumps(info))
        return info
    model, tok = load_target(work)
    tok.padding_side = "left"
    bar = tqdm(todo, desc="data (shards)")
    for i in bar:
        chunk = chunks[i]
        enc = tok([chat_text(tok, p["prompt"]) for p in chunk], return_tensors="pt", padding=True)
        greedy = shard_temperature(i) == 0.0
        torch.manual_seed(seed * 100_003 + i)
        recorder, features = TopKRecorder(TOP_K), FeatureRecorder(model)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=max_new, do_sample=not greedy,
                                 temperature=None if greedy else 1.0, top_k=None if greedy else 0, top_p=None,
                                 pad_token_id=tok.pad_token_id, logits_processor=[recorder],
                                 return_dict_in_generate=True)
        top_lp, top_id = torch.stack(recorder.values, 1), torch.stack(recorder.ids, 1)  # (B, T, k)
        hidden = features.close()
        plen = enc.input_ids.shape[1]
        rows, feats = [], []
        for b, p in enumerate(chunk):
            prompt_ids = enc.input_ids[b][enc.attention_mask[b].bool()].tolist()
            answer = out.sequences[b, plen:].tolist()
            n = len(answer)
            if tok.eos_token_id in answer:
                n = answer.index(tok.eos_token_id) + 1  # keep the end-of-turn token: the draft must learn it
            rows.append({"id": p["id"], "prompt_ids": prompt_ids, "answer_ids": answer[:n],
                         "top_ids": top_id[b, :n].clone(), "top_lp": top_lp[b, :n].clone(),
                         "temperature": shard_temperature(i)})
            feats.append(hidden[b, plen - len(prompt_ids):plen + n - 1].clone())  # prompt + answer[:-1]
            tokens += n
        feats_dir = work / "eagle" / "feats"
        feats_dir.mkdir(parents=True, exist_ok=True)
        torch.save(feats, feats_dir / f"shard_{i:05d}.tmp")  # before the shard: a shard never lacks features
        (feats_dir / f"shard_{i:05d}.tmp").rename(feats_dir / f"shard_{i:05d}.pt")
        save_compact(data / f"shard_{i:05d}.npz", rows)
        made += 1
        bar.set_postfix(tokens=tokens, tok_s=f"{tokens / (time.time() - start):.0f}")
        log_event(work, "data", shard=i, answer_tokens=sum(len(r["answer_ids"]) for r in rows))
        if time.time() - start > budget:  # checked after a shard: every run makes at least one
            break
    total = sum(len(r["answer_ids"]) for r in load_rows(work))
    info = {"shards_made": made, "answer_tokens_this_run": tokens, "seconds": time.time() - start,
            "answer_tokens_total": total, "shards_total": len(shard_paths(data))}
    print(json.dumps(info))
    return info
