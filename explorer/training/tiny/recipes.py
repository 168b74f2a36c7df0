"""The tiny family's models and how each is trained: a Llama target (next-token cross-entropy), a draft
distilled from it (KL(target || draft) plus a little cross-entropy), and a diffusion model adapted from the
target (bidirectional, shifted logits) trained with the MDLM / LLaDA masked objective, each within a time budget."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from explorer.runtime import make_bidirectional

# Sizes, batches and learning rates: FULL for the shipped models, MINI for a run of seconds (tests).
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


# --------------------------------------------------------------------------- models
def build_llama(tokenizer, arch: dict, **extra):
    """A ``LlamaForCausalLM`` with tied embeddings and context 512."""
    from transformers import LlamaConfig, LlamaForCausalLM  # deferred: transformers Llama modelling (~2 s to import)

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
