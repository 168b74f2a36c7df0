"""Shared by the SmolLM2 stages: the target, the work directory, held-out answers, logging."""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from explorer.errors import ExplorerError
from explorer.families.smollm2 import smollm2_gguf_path
from explorer.training.prompts import chat_prompts
from explorer.training.smollm2.store import load_shard, shard_paths

DEFAULT_WORK = Path(os.environ.get("EXPLORER_TRAIN_DIR", Path.home() / ".cache" / "decoding-explorer" / "smollm2"))
TOP_K = 20  # teacher log-probs kept per answer position


def target_folder(work: Path) -> Path:
    """``work/target``: the target dequantized from the GGUF once and kept as fp32 safetensors with its tokenizer."""
    from transformers import (  # deferred: transformers auto classes (~0.4 s to import)
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    cached = work / "target"
    if not (cached / "config.json").exists():
        path = smollm2_gguf_path()
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        model.hf_quantizer = None  # the weights are already dequantized to fp32: save them plainly
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = work / f"target.tmp{os.getpid()}"  # two stages started at once each write their own copy
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(cached)
        except OSError:  # the other stage got there first: its copy is the same weights
            shutil.rmtree(tmp)
    return cached


def load_target(work: Path):
    """The target (fp32, from ``target_folder``) and its tokenizer."""
    from transformers import (  # deferred: transformers auto classes (~0.4 s to import)
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    cached = target_folder(work)
    tok = AutoTokenizer.from_pretrained(cached)
    model = AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32).eval().requires_grad_(False)
    return model, tok


def chat_text(tok, prompt: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": sys.version.split()[0]}


def budget_seconds(minutes: float) -> float:
    if not (isinstance(minutes, (int, float)) and math.isfinite(minutes) and minutes > 0):
        raise ExplorerError(f"--budget-min must be a positive number of minutes (got {minutes!r})")
    return float(minutes) * 60.0


def log_event(work: Path, stage: str, **fields) -> None:
    with open(work / "log.jsonl", "a") as f:
        f.write(json.dumps({"stage": stage, "time": time.time(), **fields}) + "\n")


class RunClock:
    """The bookkeeping every training stage shares: a held-out evaluation logged as ``{stage}_eval`` at the start,
    every ``eval_every_s`` and at the end; a checkpoint every ``save_every_s`` and at the end; wall time counted
    into ``progress["seconds"]`` (so it adds up across resumed runs)."""

    def __init__(self, work: Path, stage: str, progress: dict, evaluate, save, eval_every_s: float,
                 save_every_s: float = 300.0):
        self.work, self.stage, self.progress = work, stage, progress
        self.evaluate, self.save, self.eval_every_s, self.save_every_s = evaluate, save, eval_every_s, save_every_s
        self.last_eval = self.last_save = time.time()

    def begin(self, **extra) -> dict:
        first = self.evaluate()
        log_event(self.work, f"{self.stage}_eval", **self.progress, **first)
        print(json.dumps({"start": first, **self.progress, **extra}))
        return first

    def tick(self) -> None:
        """After a step: evaluate or checkpoint if one is due."""
        now = time.time()
        if now - self.last_eval > self.eval_every_s:
            self.last_eval = now
            log_event(self.work, f"{self.stage}_eval", **self.progress, **self.evaluate())
        if now - self.last_save > self.save_every_s:
            self.progress["seconds"] += now - self.last_save
            self.last_save = now
            self.save()

    def finish(self) -> dict:
        self.progress["seconds"] += time.time() - self.last_save
        self.save()
        final = self.evaluate()
        log_event(self.work, f"{self.stage}_eval", **self.progress, **final)
        print(json.dumps({"end": final, **self.progress}))
        return {"progress": self.progress, "eval": final}


def load_rows(work: Path, limit: int | None = None) -> list[dict]:
    rows = []
    for path in list(shard_paths(work / "data").values())[:limit]:
        rows.extend(load_shard(path))
    return rows


# --------------------------------------------------------------------------- held-out answers
HELDOUT_PROMPTS = 32
HELDOUT_TOKENS = 128


def heldout_answers(work: Path, model, tok) -> list[dict]:
    """The target's greedy answers to held-out prompts (unseen topics), made once and cached."""
    path = work / "heldout_greedy.pt"
    if path.exists():
        return torch.load(path)
    prompts = chat_prompts("heldout")[:HELDOUT_PROMPTS]
    tok.padding_side = "left"
    enc = tok([chat_text(tok, p["prompt"]) for p in prompts], return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=HELDOUT_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
    rows, plen = [], enc.input_ids.shape[1]
    for b, p in enumerate(prompts):
        answer = out[b, plen:].tolist()
        if tok.eos_token_id in answer:
            answer = answer[:answer.index(tok.eos_token_id) + 1]
        rows.append({"id": p["id"], "prompt": p["prompt"], "prompt_ids": enc.input_ids[b][enc.attention_mask[b].bool()]
                     .tolist(), "answer_ids": answer})
    torch.save(rows, path)
    return rows




# --------------------------------------------------------------------------- one optimizer step
def schedule_lr(opt, lr: float, step_in_run: int, frac: float) -> None:
    """Linear warm-up over 20 steps, then cosine from ``lr`` to lr / 10 over the run's budget (frac 0 .. 1); a
    parameter group with an ``lr_scale`` runs at that multiple."""
    warm = min(1.0, (step_in_run + 1) / 20)
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0) * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def optimizer_step(opt, params, loss) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
