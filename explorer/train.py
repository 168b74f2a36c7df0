"""Train the embedded ``tiny`` model family from scratch (CPU, fixed seeds).

    python -m explorer.train [--out assets/models/tiny] [--budget-target-min 28]
        [--budget-draft-min 10] [--budget-diffusion-min 18] [--mini]

Pipeline (each stage moved into ``out`` atomically once it is complete):

1. corpus    -- the CPython standard library of the running interpreter, split
                train / held-out by a hash of each file's relative path;
2. tokenizer -- byte-level BPE (vocab 8192) with ``<|endoftext|>``, ``<|pad|>``,
                ``<|mask|>``; no special token is ever added by ``tokenizer(text)``;
3. target    -- a small autoregressive ``LlamaForCausalLM``;
4. draft     -- a much smaller Llama distilled from the target with KL(target||draft)
                (Hinton et al. 2015 "Distilling the knowledge in a neural network";
                DistillSpec, Zhou et al. 2023);
5. diffusion -- the target's weights adapted into a bidirectional masked-diffusion
                model with shifted logits (Dream 7B, Ye et al. 2025; DiffuLLaMA,
                Gong et al. 2024), trained with the MDLM / LLaDA objective
                (Sahoo et al. 2024; Nie et al. 2025).

``train_report.json`` records the corpus, configs, parameter counts, FLOPs, wall
time, held-out losses, draft/target agreement and forward latencies.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from explorer.models import make_bidirectional

EOS, PAD, MASK = "<|endoftext|>", "<|pad|>", "<|mask|>"
SPECIAL_TOKENS = [EOS, PAD, MASK]
SKIP_DIRS = ("test", "tests", "idlelib", "site-packages", "__pycache__", "pydoc_data")
HELDOUT_MOD = 20  # sha1(relative path) % 20 == 0 -> held-out
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "assets" / "models" / "tiny"
SIZE_LIMIT_MB = 60.0

FULL = {
    "vocab_size": 8192,
    "seq_len": 256,
    "max_files": None,
    "target": dict(num_hidden_layers=12, hidden_size=256, intermediate_size=640,
                   num_attention_heads=4, num_key_value_heads=4),
    "draft": dict(num_hidden_layers=1, hidden_size=128, intermediate_size=384,
                  num_attention_heads=2, num_key_value_heads=2),
    "batch": {"target": 8, "draft": 8, "diffusion": 8},
    "lr": {"target": 1.5e-3, "draft": 3e-3, "diffusion": 1e-3},
    "max_steps": None,
    "eval_windows": 240,
    "latency_reps": 60,
}
MINI = {
    "vocab_size": 400,
    "seq_len": 64,
    "max_files": 40,
    "target": dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                   num_attention_heads=2, num_key_value_heads=2),
    "draft": dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                  num_attention_heads=2, num_key_value_heads=2),
    "batch": {"target": 4, "draft": 4, "diffusion": 4},
    "lr": {"target": 2e-3, "draft": 3e-3, "diffusion": 5e-4},
    "max_steps": 3,
    "eval_windows": 4,
    "latency_reps": 3,
}


# --------------------------------------------------------------------------- corpus
def find_stdlib_files(root: Path) -> list[Path]:
    """Return the stdlib ``*.py`` files (sorted), skipping test/idle/site-packages dirs."""
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if not any(part in SKIP_DIRS for part in parts):
            files.append(path)
    return files


def is_heldout(rel_path: str) -> bool:
    """Deterministic split: a file is held-out when sha1(relative path) % 20 == 0."""
    return int(hashlib.sha1(rel_path.encode()).hexdigest(), 16) % HELDOUT_MOD == 0


def load_corpus(max_files: int | None = None) -> dict:
    """Read the running interpreter's stdlib and split it into train / held-out texts."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = find_stdlib_files(root)
    if max_files:
        files = pick_mini_files(files, root, max_files)
    train, heldout, skipped = [], [], 0
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        (heldout if is_heldout(rel) else train).append(text)
    return {"root": str(root), "train": train, "heldout": heldout,
            "skipped_non_utf8": skipped, "skip_dirs": list(SKIP_DIRS)}


def pick_mini_files(files: list[Path], root: Path, n: int) -> list[Path]:
    """Small, deterministic slice with both splits present (for ``--mini``)."""
    small = [p for p in files if p.stat().st_size < 20_000]
    held = [p for p in small if is_heldout(p.relative_to(root).as_posix())][:2]
    train = [p for p in small if p not in held][: n - len(held)]
    return sorted(train + held)


# ------------------------------------------------------------------------ tokenizer
def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style) with eos/bos, pad and mask special tokens.

    No post-processor: ``tokenizer(text).input_ids`` never adds a special token, and
    the ByteLevel decoder makes ``decode(encode(text)) == text`` for any text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=PAD,
        mask_token=MASK, clean_up_tokenization_spaces=False, model_max_length=512)


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Token ids of all documents joined by ``<|endoftext|>`` (one between each)."""
    eos = tokenizer.eos_token_id
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    ids: list[int] = []
    for enc in encodings:
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


def count_token_bytes(tokenizer) -> torch.Tensor:
    """UTF-8 bytes per token id (ByteLevel: one char per byte; special tokens = 1)."""
    table = torch.ones(len(tokenizer), dtype=torch.float64)
    special = set(tokenizer.all_special_ids)
    for token, idx in tokenizer.get_vocab().items():
        if idx not in special:
            table[idx] = len(token)
    return table


# --------------------------------------------------------------------------- models
def build_llama(tokenizer, arch: dict, **extra):
    """A ``LlamaForCausalLM`` with tied embeddings and context 512."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **arch, **extra)
    return LlamaForCausalLM(config)


def build_diffusion(target, tokenizer):
    """Dream/DiffuLLaMA-style adaptation: target weights, bidirectional, shifted logits."""
    extra = dict(is_causal=False, shift_logits=True, explorer_kind="diffusion",
                 mask_token_id=tokenizer.mask_token_id)
    arch = {k: getattr(target.config, k) for k in FULL["target"]}
    model = build_llama(tokenizer, arch, **extra)
    model.load_state_dict(target.state_dict())
    return make_bidirectional(model)


def check_bidirectional(model, vocab: int, seq_len: int = 16) -> bool:
    """True when changing the last token changes the logits at position 0."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, seq_len), generator=gen)
    other = ids.clone()
    other[0, -1] = (ids[0, -1] + 1) % vocab
    model.eval()
    with torch.no_grad():
        a = model(ids).logits[0, 0]
        b = model(other).logits[0, 0]
    return not torch.allclose(a, b, atol=1e-5)


def count_params(model) -> int:
    """Unique parameters (tied embedding counted once)."""
    return sum(p.numel() for p in model.parameters())


def estimate_flops(config, context: int = 256) -> dict:
    """Forward FLOPs per token: 2 * matmul MACs incl. LM head, plus attention scores."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    head_dim = h // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter
    matmul = 2 * (layers * per_layer + config.vocab_size * h)
    attention = 2 * 2 * layers * context * h
    return {"matmul_flops_per_token": matmul, "attention_flops_per_token_at_ctx": attention,
            "context": context, "total_flops_per_token": matmul + attention}


def summarize_config(config) -> dict:
    """The config fields worth reporting."""
    keys = ["num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "max_position_embeddings",
            "tie_word_embeddings", "is_causal", "shift_logits", "explorer_kind"]
    return {k: getattr(config, k) for k in keys if hasattr(config, k)}


# ------------------------------------------------------------------------- training
def sample_windows(stream: torch.Tensor, batch: int, seq_len: int, gen) -> torch.Tensor:
    """Random training windows (int64, shape batch x seq_len)."""
    starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=gen)
    return torch.stack([stream[s: s + seq_len] for s in starts.tolist()]).long()


def schedule_lr(frac: float, warmup: float = 0.03, floor: float = 0.1) -> float:
    """Linear warmup then cosine decay, on the fraction of the wall budget spent."""
    if frac < warmup:
        return max(frac / warmup, 0.02)
    progress = min((frac - warmup) / (1 - warmup), 1.0)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def run_budget(model, loss_fn, lr: float, budget_s: float, max_steps, desc: str) -> dict:
    """AdamW + cosine loop: call ``loss_fn()`` until the wall budget (or max_steps) is spent."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    start, step, tokens, ema = time.time(), 0, 0, None
    bar = tqdm(total=int(budget_s), desc=desc, unit="s", mininterval=5, dynamic_ncols=True)
    while True:
        elapsed = time.time() - start
        if elapsed >= budget_s or (max_steps is not None and step >= max_steps):
            break
        for group in opt.param_groups:
            group["lr"] = lr * schedule_lr(elapsed / budget_s)
        loss, n_tok = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step, tokens = step + 1, tokens + n_tok
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.n = min(int(time.time() - start), int(budget_s))
        bar.set_postfix(step=step, loss=f"{ema:.3f}", tok=tokens, refresh=False)
        bar.refresh()
    bar.close()
    model.eval()
    return {"steps": step, "tokens_seen": tokens, "wall_s": round(time.time() - start, 1),
            "final_loss_ema": ema, "peak_lr": lr, "batch_tokens": None}


def train_target(model, stream, cfg: dict, budget_s: float) -> dict:
    """Next-token cross-entropy pre-training of the autoregressive target."""
    gen = torch.Generator().manual_seed(1)
    batch, seq = cfg["batch"]["target"], cfg["seq_len"]

    def loss_fn():
        x = sample_windows(stream, batch, seq, gen)
        return model(input_ids=x, labels=x).loss, x.numel()

    stats = run_budget(model, loss_fn, cfg["lr"]["target"], budget_s, cfg["max_steps"], "target")
    return stats | {"batch_tokens": batch * seq}


def distill_loss(student_logits, teacher_logits, labels, ce_weight: float = 0.1):
    """KL(teacher || student) at temperature 1 (Hinton 2015; DistillSpec, Zhou et al. 2023)
    plus a little next-token CE."""
    vocab = student_logits.size(-1)
    s_logp = F.log_softmax(student_logits[:, :-1].reshape(-1, vocab), dim=-1)
    t_logp = F.log_softmax(teacher_logits[:, :-1].reshape(-1, vocab), dim=-1)
    kl = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean")
    ce = F.nll_loss(s_logp, labels[:, 1:].reshape(-1))
    return kl + ce_weight * ce


def train_draft(draft, target, stream, cfg: dict, budget_s: float) -> dict:
    """Distil the draft from the (frozen) target on training windows."""
    gen = torch.Generator().manual_seed(2)
    batch, seq = cfg["batch"]["draft"], cfg["seq_len"]
    target.eval()

    def loss_fn():
        x = sample_windows(stream, batch, seq, gen)
        with torch.no_grad():
            teacher = target(input_ids=x).logits
        return distill_loss(draft(input_ids=x).logits, teacher, x), x.numel()

    stats = run_budget(draft, loss_fn, cfg["lr"]["draft"], budget_s, cfg["max_steps"], "draft")
    return stats | {"batch_tokens": batch * seq}


def mask_batch(x: torch.Tensor, mask_id: int, gen, eps: float = 1e-3):
    """Forward process of masked diffusion (MDLM, Sahoo et al. 2024; LLaDA, Nie et al. 2025).

    Per sequence t ~ U(eps, 1); each non-prefix token is masked with prob t. Half the
    sequences keep a clean prompt prefix of 8..128 tokens; position 0 is never masked
    (with shifted logits it has no predicting position). Returns (noisy, masked, t).
    """
    batch, seq = x.shape
    t = eps + (1 - eps) * torch.rand(batch, generator=gen)
    max_prefix = max(min(128, seq // 2), 2)
    prefix = torch.randint(min(8, max_prefix - 1), max_prefix, (batch,), generator=gen)
    prefix = torch.where(torch.rand(batch, generator=gen) < 0.5, prefix, torch.ones_like(prefix))
    positions = torch.arange(seq).unsqueeze(0)
    maskable = positions >= prefix.unsqueeze(1)
    masked = (torch.rand(batch, seq, generator=gen) < t.unsqueeze(1)) & maskable
    return torch.where(masked, torch.full_like(x, mask_id), x), masked, t


def diffusion_loss(model, x: torch.Tensor, mask_id: int, gen) -> torch.Tensor:
    """Shifted masked-diffusion loss (Dream 2025): token i is predicted from logits at i-1;
    CE over masked tokens weighted by 1/t, divided by the number of tokens (MDLM/LLaDA)."""
    noisy, masked, t = mask_batch(x, mask_id, gen)
    logits = model(input_ids=noisy).logits[:, :-1]
    targets, is_masked = x[:, 1:], masked[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                         reduction="none").view_as(targets)
    weighted = ce * is_masked / t.unsqueeze(1)
    return weighted.sum() / x.numel()


def train_diffusion(model, stream, cfg: dict, budget_s: float, mask_id: int) -> dict:
    """Adapt the bidirectional model with the masked-diffusion objective."""
    gen = torch.Generator().manual_seed(3)
    batch, seq = cfg["batch"]["diffusion"], cfg["seq_len"]

    def loss_fn():
        x = sample_windows(stream, batch, seq, gen)
        return diffusion_loss(model, x, mask_id, gen), x.numel()

    stats = run_budget(model, loss_fn, cfg["lr"]["diffusion"], budget_s, cfg["max_steps"],
                       "diffusion")
    return stats | {"batch_tokens": batch * seq}


# ----------------------------------------------------------------------- evaluation
def eval_windows(stream: torch.Tensor, seq_len: int, limit: int) -> torch.Tensor:
    """Non-overlapping held-out windows, evenly spread over the held-out stream."""
    n = len(stream) // seq_len
    idx = torch.linspace(0, n - 1, steps=min(limit, n)).long().unique()
    return torch.stack([stream[i * seq_len: (i + 1) * seq_len] for i in idx.tolist()]).long()


def evaluate_ar(target, draft, windows, byte_table, unigram_logp) -> dict:
    """Held-out bits per byte (target, draft, unigram baseline) and greedy agreement.

    Predicted tokens are positions 1..T-1 of each window (teacher-forced)."""
    nats = {"target": 0.0, "draft": 0.0, "unigram": 0.0}
    agree = total = 0
    n_bytes = 0.0
    with torch.no_grad():
        for x in windows.split(8):
            labels = x[:, 1:]
            n_bytes += byte_table[labels].sum().item()
            nats["unigram"] -= unigram_logp[labels].sum().item()
            argmax = {}
            for name, model in (("target", target), ("draft", draft)):
                logits = model(input_ids=x).logits[:, :-1]
                nats[name] += F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                              labels.reshape(-1), reduction="sum").item()
                argmax[name] = logits.argmax(-1)
            agree += (argmax["target"] == argmax["draft"]).sum().item()
            total += labels.numel()
    bpb = {f"{k}_bpb": v / math.log(2) / n_bytes for k, v in nats.items()}
    return bpb | {"draft_target_greedy_agreement": agree / total, "eval_tokens": total,
                  "eval_bytes": n_bytes, "bytes_per_token": n_bytes / total,
                  "target_ce_nats_per_token": nats["target"] / total,
                  "draft_ce_nats_per_token": nats["draft"] / total}


def unigram_logprobs(stream: torch.Tensor, vocab: int) -> torch.Tensor:
    """Add-one smoothed unigram log-probabilities from training token counts."""
    counts = torch.bincount(stream.long(), minlength=vocab).double() + 1
    return (counts / counts.sum()).log()


def evaluate_diffusion(model, windows, mask_id: int, byte_table) -> dict:
    """Held-out masked-diffusion loss (same objective, fixed seed) and per-t losses."""
    gen = torch.Generator().manual_seed(4)
    total, n = 0.0, 0
    with torch.no_grad():
        for x in windows.split(8):
            total += diffusion_loss(model, x, mask_id, gen).item() * x.numel()
            n += x.numel()
        per_t = {f"t={t}": masked_ce_at(model, windows[:32], mask_id, t) for t in (0.15, 0.5, 0.9)}
    nelbo = total / n
    bpt = byte_table[windows].mean().item()
    return {"heldout_nelbo_nats_per_token": nelbo, "heldout_nelbo_bpb": nelbo / math.log(2) / bpt,
            "heldout_masked_ce_nats_by_t": per_t}


def masked_ce_at(model, x, mask_id: int, t: float) -> float:
    """Mean CE (nats) on masked tokens when each token (but position 0) is masked w.p. t."""
    gen = torch.Generator().manual_seed(5)
    masked = torch.rand(x.shape, generator=gen) < t
    masked[:, 0] = False
    noisy = torch.where(masked, torch.full_like(x, mask_id), x)
    logits = model(input_ids=noisy).logits[:, :-1]
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                         reduction="none")
    sel = masked[:, 1:].reshape(-1)
    return ce[sel].mean().item()


def measure_latency(model, n_new: int, reps: int, cache_len: int = 100) -> float:
    """Median ms of a batch-1 forward of ``n_new`` tokens on a KV cache of ``cache_len``."""
    gen = torch.Generator().manual_seed(6)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab - 3, (1, cache_len), generator=gen)
    times = []
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).past_key_values
        for _ in range(reps + 3):
            x = torch.randint(0, vocab - 3, (1, n_new), generator=gen)
            t0 = time.perf_counter()
            model(input_ids=x, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            cache.crop(-n_new)
    times = sorted(times[3:])
    return round(1000 * times[len(times) // 2], 3)


def measure_full_latency(model, seq_len: int, reps: int) -> float:
    """Median ms of a batch-1 full (no-cache) forward of ``seq_len`` tokens."""
    x = torch.randint(0, model.config.vocab_size - 3, (1, seq_len),
                      generator=torch.Generator().manual_seed(7))
    times = []
    with torch.no_grad():
        for _ in range(reps + 2):
            t0 = time.perf_counter()
            model(input_ids=x)
            times.append(time.perf_counter() - t0)
    times = sorted(times[2:])
    return round(1000 * times[len(times) // 2], 3)


# ---------------------------------------------------------------------------- saving
def choose_save_dtype(cfg: dict, vocab: int) -> torch.dtype:
    """fp32 when target + draft + diffusion fit in SIZE_LIMIT_MB, else fp16."""
    from transformers import LlamaConfig

    total = 0
    for name, copies in (("target", 2), ("draft", 1)):
        c = LlamaConfig(vocab_size=vocab, **cfg[name])
        flops = estimate_flops(c)["matmul_flops_per_token"]
        total += copies * flops / 2  # MACs per token == parameters (tied head) roughly
    return torch.float32 if total * 4 / 1e6 < SIZE_LIMIT_MB else torch.float16


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


def save_model(model, tokenizer, out_dir: Path, name: str, dtype: torch.dtype) -> Path:
    """Save a model (weights in ``dtype``) plus a copy of the tokenizer so it loads alone.

    ``config.dtype`` stays float32 so that a default ``from_pretrained`` on CPU loads fp32
    even when the stored weights are fp16 (to keep the assets small)."""
    def write(tmp: Path):
        tied = model.config.tie_word_embeddings
        state = {k: v.to(dtype) for k, v in model.state_dict().items()
                 if not (tied and k == "lm_head.weight")}
        model.config.dtype = torch.float32
        model.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
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
    from transformers import __version__ as tf_version

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
    dtype = choose_save_dtype(cfg, len(tokenizer))
    report["save_dtype"] = str(dtype)
    save_report(out_dir, report)

    torch.manual_seed(10)
    target = build_llama(tokenizer, cfg["target"])
    stats = train_target(target, train_stream, cfg, budgets_s["target"])
    save_model(target, tokenizer, out_dir, "target", dtype)
    report["target"] = describe_model(target, stats)
    save_report(out_dir, report)

    torch.manual_seed(20)
    draft = build_llama(tokenizer, cfg["draft"])
    stats = train_draft(draft, target, train_stream, cfg, budgets_s["draft"])
    save_model(draft, tokenizer, out_dir, "draft", dtype)
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
    save_model(diffusion, tokenizer, out_dir, "diffusion", dtype)
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
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    torch.set_num_threads(2)
    target = AutoModelForCausalLM.from_pretrained(out_dir / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(out_dir / "draft").eval()
    latency = measure_ar_latency(target, draft, reps)
    report = json.loads((out_dir / "train_report.json").read_text())
    old = report.get("latency_ms", {})
    keep = {k: v for k, v in old.items() if k.startswith("diffusion")}
    report["latency_ms"] = latency | keep | {"remeasured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                                             "during_training": old}
    save_report(out_dir, report)
    return latency


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--budget-target-min", type=float, default=28)
    p.add_argument("--budget-draft-min", type=float, default=10)
    p.add_argument("--budget-diffusion-min", type=float, default=18)
    p.add_argument("--mini", action="store_true", help="tiny sizes on a corpus slice (seconds)")
    p.add_argument("--threads", type=int, default=2, help="torch threads for training")
    p.add_argument("--latency-only", action="store_true",
                   help="re-measure latencies of the saved models and update the report")
    return p.parse_args(argv)


def main(argv=None) -> None:
    """Entry point of ``python -m explorer.train`` (``... train smollm2 STAGE`` for the SmolLM2 family)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["smollm2"]:
        from explorer.training import smollm2

        smollm2.main(argv[1:])
        return
    args = parse_args(argv)
    if args.latency_only:
        print(json.dumps(remeasure_latency(args.out), indent=2))
        return
    budgets = {"target": args.budget_target_min, "draft": args.budget_draft_min,
               "diffusion": args.budget_diffusion_min}
    report = train_all(args.out, mini=args.mini, budgets_min=budgets, threads=args.threads)
    summary = {k: report.get(k) for k in ("heldout_ar", "latency_ms", "weights_mb")}
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
