"""The tiny family's pipeline: each stage trained within its budget, saved into ``out`` atomically once
complete, and ``train_report.json`` written (see ``explorer.train`` for the stages)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import __version__ as tf_version

from explorer.compact_weights import from_pretrained, save_compact
from explorer.training.tiny.corpus import (
    EOS,
    HELDOUT_MOD,
    count_token_bytes,
    encode_stream,
    load_corpus,
    train_tokenizer,
)
from explorer.training.tiny.evaluation import (
    eval_windows,
    evaluate_ar,
    evaluate_diffusion,
    measure_full_latency,
    measure_latency,
    unigram_logprobs,
)
from explorer.training.tiny.recipes import (
    FULL,
    MINI,
    build_diffusion,
    build_llama,
    check_bidirectional,
    count_params,
    estimate_flops,
    summarize_config,
    train_diffusion,
    train_draft,
    train_target,
)

DEFAULT_OUT = Path(__file__).resolve().parents[3] / "assets" / "models" / "tiny"



# ---------------------------------------------------------------------------- saving
def save_dir_atomic(out_dir: Path, name: str, write) -> Path:
    """Write ``out_dir/name`` via a temp sibling dir, then swap it into place."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    final = out_dir / name
    if final.exists():
        old = out_dir / f".{name}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    return final


def save_model(model, out_dir: Path, name: str, bits: int = 8) -> Path:
    """Save a model: ``config.json``, ``generation_config.json`` and compact weights (``bits`` 8: int8 rows,
    4: int4 groups, ``explorer.compact_weights``; load with its ``from_pretrained``). The tokenizer is saved
    once, in ``out_dir/tokenizer``."""
    def write(tmp: Path):
        tied = model.config.tie_word_embeddings
        state = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        model.config.dtype = torch.float32
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        save_compact(state, tmp / "model.safetensors", bits=bits)
    return save_dir_atomic(out_dir, name, write)


def save_report(out_dir: Path, report: dict) -> None:
    """Write train_report.json atomically (called after every stage)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".train_report.json.tmp"
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    os.replace(tmp, out_dir / "train_report.json")


def remove_stale_models(out_dir: Path) -> None:
    """Models from an older build do not match a new tokenizer: drop them first."""
    for name in ("target", "draft", "diffusion", "train_report.json"):
        path = out_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def dir_size_mb(path: Path) -> float:
    """Total size of the safetensors files under ``path`` in MB."""
    return sum(p.stat().st_size for p in path.rglob("*.safetensors")) / 1e6


# ------------------------------------------------------------------------- pipeline
def describe_machine() -> dict:
    """Where the models were trained."""
    return {"processor": platform.processor() or platform.machine(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": sys.version.split()[0]}


def describe_model(model, stats: dict) -> dict:
    """Config summary, parameter count, FLOPs/token and training stats."""
    return {"config": summarize_config(model.config), "params": count_params(model),
            "flops": estimate_flops(model.config), "training": stats}


def train_all(out_dir: Path | str = DEFAULT_OUT, mini: bool = False, budgets_min=None,
              threads: int = 2) -> dict:
    """Rebuild tokenizer, target, draft and diffusion models into ``out_dir``."""
    cfg = MINI if mini else FULL
    budgets = budgets_min or {"target": 28, "draft": 10, "diffusion": 18}
    budgets_s = {k: (60.0 if mini else 60.0 * v) for k, v in budgets.items()}
    out_dir = Path(out_dir)
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    t_start = time.time()
    report = {"mini": mini, "budgets_min": budgets, "machine": describe_machine(),
              "transformers": tf_version, "status": "running"}

    corpus = load_corpus(cfg["max_files"])
    tokenizer = train_tokenizer(corpus["train"], cfg["vocab_size"])
    train_stream = encode_stream(tokenizer, corpus["train"])
    held_stream = encode_stream(tokenizer, corpus["heldout"])
    report["corpus"] = describe_corpus(corpus, train_stream, held_stream)
    report["tokenizer"] = {"vocab_size": len(tokenizer), "eos_id": tokenizer.eos_token_id,
                           "pad_id": tokenizer.pad_token_id, "mask_id": tokenizer.mask_token_id,
                           "type": "byte-level BPE, no added special tokens"}
    remove_stale_models(out_dir)
    save_dir_atomic(out_dir, "tokenizer", tokenizer.save_pretrained)
    report["save_dtype"] = "target and draft int8 rows, diffusion int4 groups of 32 (explorer.compact_weights)"
    save_report(out_dir, report)

    torch.manual_seed(10)
    target = build_llama(tokenizer, cfg["target"])
    stats = train_target(target, train_stream, cfg, budgets_s["target"])
    save_model(target, out_dir, "target")
    report["target"] = describe_model(target, stats)
    save_report(out_dir, report)

    torch.manual_seed(20)
    draft = build_llama(tokenizer, cfg["draft"])
    stats = train_draft(draft, target, train_stream, cfg, budgets_s["draft"])
    save_model(draft, out_dir, "draft")  # int8: int4 cost ~8% of its acceptance (the model card)
    report["draft"] = describe_model(draft, stats)
    windows = eval_windows(held_stream, cfg["seq_len"], cfg["eval_windows"])
    byte_table = count_token_bytes(tokenizer)
    unigram = unigram_logprobs(train_stream, len(tokenizer))
    report["heldout_ar"] = evaluate_ar(target, draft, windows, byte_table, unigram)
    report["latency_ms"] = measure_ar_latency(target, draft, cfg["latency_reps"])
    save_report(out_dir, report)

    torch.manual_seed(30)
    diffusion = build_diffusion(target, tokenizer)
    assert check_bidirectional(diffusion, len(tokenizer)), "diffusion model is causal"
    stats = train_diffusion(diffusion, train_stream, cfg, budgets_s["diffusion"],
                            tokenizer.mask_token_id)
    save_model(diffusion, out_dir, "diffusion", bits=4)  # its text: no visible change in int4 (the model card)
    report["diffusion"] = describe_model(diffusion, stats)
    report["diffusion"]["bidirectional_check"] = check_bidirectional(diffusion, len(tokenizer))
    report["diffusion"]["heldout"] = evaluate_diffusion(
        diffusion, windows, tokenizer.mask_token_id, byte_table)
    report["latency_ms"]["diffusion_full_forward_128"] = measure_full_latency(
        diffusion, 128, cfg["latency_reps"])
    report["weights_mb"] = {n: round(dir_size_mb(out_dir / n), 2)
                            for n in ("target", "draft", "diffusion")}
    report["weights_mb"]["total"] = round(sum(report["weights_mb"].values()), 2)
    report["total_wall_s"] = round(time.time() - t_start, 1)
    report["status"] = "complete"
    save_report(out_dir, report)
    return report


def describe_corpus(corpus: dict, train_stream, held_stream) -> dict:
    """File and token counts of the stdlib corpus split."""
    return {"source": "CPython standard library (*.py)", "stdlib_path": corpus["root"],
            "python_version": sys.version.split()[0],
            "skip_dirs": corpus["skip_dirs"],
            "split": f"held-out iff int(sha1(relative_path), 16) % {HELDOUT_MOD} == 0",
            "files_train": len(corpus["train"]), "files_heldout": len(corpus["heldout"]),
            "files_skipped_non_utf8": corpus["skipped_non_utf8"],
            "chars_train": sum(map(len, corpus["train"])),
            "chars_heldout": sum(map(len, corpus["heldout"])),
            "tokens_train": len(train_stream), "tokens_heldout": len(held_stream),
            "doc_separator": EOS}


def measure_ar_latency(target, draft, reps: int) -> dict:
    """Batch-1 forward latency (ms, KV cache of 100 tokens) and the cost ratio c."""
    lat = {"target_1_token": measure_latency(target, 1, reps),
           "target_5_tokens": measure_latency(target, 5, reps),
           "draft_1_token": measure_latency(draft, 1, reps),
           "kv_cache_tokens": 100, "threads": torch.get_num_threads()}
    lat["cost_ratio_c"] = round(lat["draft_1_token"] / lat["target_1_token"], 4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    one = {"target_1_token": measure_latency(target, 1, reps),
           "target_5_tokens": measure_latency(target, 5, reps),
           "draft_1_token": measure_latency(draft, 1, reps)}
    torch.set_num_threads(threads)
    one["cost_ratio_c"] = round(one["draft_1_token"] / one["target_1_token"], 4)
    return lat | {"one_thread": one}


def remeasure_latency(out_dir: Path, reps: int = 200) -> dict:
    """Load the saved target/draft and re-measure latency (e.g. on a quiet machine)."""
    from transformers import AutoModelForCausalLM  # deferred: transformers auto classes (~0.4 s to import)

    out_dir = Path(out_dir)
    torch.set_num_threads(2)
    target = from_pretrained(AutoModelForCausalLM, out_dir / "target")
    draft = from_pretrained(AutoModelForCausalLM, out_dir / "draft")
    latency = measure_ar_latency(target, draft, reps)
    report = json.loads((out_dir / "train_report.json").read_text())
    old = report.get("latency_ms", {})
    keep = {k: v for k, v in old.items() if k.startswith("diffusion")}
    report["latency_ms"] = latency | keep | {"remeasured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                                             "during_training": old}
    save_report(out_dir, report)
    return latency


