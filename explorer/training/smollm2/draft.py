"""Stage 2: the draft, distilled from the target (trimmed head, FR-Spec)."""

from __future__ import annotations

import copy
import sysconfig
import time
from pathlib import Path

import torch
from tqdm import tqdm

from explorer.errors import ExplorerError
from explorer.families.smollm2.trimmed_draft import TrimmedHeadDraft, load_trimmed_draft
from explorer.training.smollm2.common import (
    RunClock,
    budget_seconds,
    heldout_answers,
    load_rows,
    load_target,
    optimizer_step,
    schedule_lr,
)


def greedy_tokens_per_pass(matches: list[bool], gamma: int) -> tuple[int, int]:
    """Greedy speculative decoding along a fixed answer: (tokens, target passes).

    ``matches[i]``: the draft's argmax equals answer token i given the true prefix. Each pass
    accepts the run of matches (at most gamma) and adds one target token; exact for greedy decoding.
    """
    pos, passes = 0, 0
    while pos < len(matches):
        run = 0
        while run < gamma and pos + run < len(matches) and matches[pos + run]:
            run += 1
        pos += run + 1
        passes += 1
    return len(matches), passes


def token_counts(work: Path, tok, vocab: int) -> torch.Tensor:
    """Token frequencies that decide the trimmed head (FR-Spec): how often each token is an answer
    token or in the teacher's top-k (probability-weighted), plus a tenth of its frequency in local
    English and Python text (the interpreter's pydoc topics and a slice of its standard library), so
    the kept set does not depend only on the answers generated so far."""
    counts = torch.zeros(vocab, dtype=torch.float64)
    for row in load_rows(work):
        counts.index_add_(0, torch.tensor(row["answer_ids"]), torch.ones(len(row["answer_ids"]), dtype=torch.float64))
        counts.index_add_(0, row["top_ids"].long().flatten(), row["top_lp"].double().exp().flatten())
    answer_total = float(counts.sum())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / "pydoc_data" / "topics.py").read_text(encoding="utf-8", errors="ignore")]
    texts += [f.read_text(encoding="utf-8", errors="ignore") for f in sorted(stdlib.glob("*.py"))[:120]]
    local = torch.zeros(vocab, dtype=torch.float64)
    for text in texts:
        ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"])
        local.index_add_(0, ids, torch.ones(len(ids), dtype=torch.float64))
    return counts + 0.1 * local * answer_total / max(1.0, float(local.sum()))


def build_draft(target, kept_ids: torch.Tensor, layers: int):
    """The target's first ``layers`` layers, its final norm and its head rows for the kept tokens."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    config.tie_word_embeddings = False
    draft = TrimmedHeadDraft(config, kept_ids, embed_tokens=target.get_input_embeddings())
    missing, _ = draft.model.load_state_dict(
        {k: v for k, v in target.model.state_dict().items()
         if not k.startswith("layers.") or int(k.split(".")[1]) < layers}, strict=False)
    assert not [k for k in missing if "rotary" not in k], missing
    with torch.no_grad():
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight[kept_ids])
    return draft


def draft_batches(rows: list[dict], batch: int, gen: torch.Generator, pad_id: int):
    """Right-padded batches of prompt+answer, with (row, position) indices of answer predictions."""
    order = torch.randperm(len(rows), generator=gen).tolist()
    for start in range(0, len(order), batch):
        chunk = [rows[i] for i in order[start:start + batch]]
        seqs = [r["prompt_ids"] + r["answer_ids"][:-1] for r in chunk]
        width = max(map(len, seqs))
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        positions, top_ids, top_lp = [], [], []
        for b, (r, seq) in enumerate(zip(chunk, seqs, strict=True)):
            ids[b, :len(seq)] = torch.tensor(seq)
            mask[b, :len(seq)] = 1
            p = len(r["prompt_ids"])
            n = len(r["answer_ids"])
            positions.append(torch.stack([torch.full((n,), b), torch.arange(p - 1, p - 1 + n)], 1))  # (n, 2)
            top_ids.append(r["top_ids"].long())
            top_lp.append(r["top_lp"].float())
        yield ids, mask, torch.cat(positions), torch.cat(top_ids), torch.cat(top_lp)


def distill_topk_loss(logits: torch.Tensor, top_ids_trim: torch.Tensor, top_lp: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the draft against the teacher's top-k distribution (forward KL up to a constant).

    logits: (N, K) over kept tokens; top_ids_trim: (N, k) kept-index of the teacher's top-k ids (-1
    where a token was trimmed away: its mass is unreachable for the draft and is dropped).
    """
    logq = torch.log_softmax(logits.float(), dim=-1)  # (N, K)
    kept = top_ids_trim >= 0
    p = top_lp.exp() * kept  # (N, k)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-6)
    return -(p * logq.gather(-1, top_ids_trim.clamp_min(0))).sum(-1).mean()


@torch.no_grad()
def evaluate_draft(draft, heldout: list[dict], gammas=(1, 2, 4)) -> dict:
    """Teacher-forced agreement with the target's greedy answers, and the tokens per target pass that
    greedy speculative decoding would get along them."""
    draft.eval()
    matches_all, per_gamma = [], {g: [0, 0] for g in gammas}
    for r in heldout:
        seq = r["prompt_ids"] + r["answer_ids"][:-1]
        p, n = len(r["prompt_ids"]), len(r["answer_ids"])
        logits, _ = draft.trimmed_logits(torch.tensor([seq]))
        pred = draft.kept_ids[logits[0, p - 1:p - 1 + n].argmax(-1)]  # (n,) full-vocab ids
        matches = (pred == torch.tensor(r["answer_ids"])).tolist()
        matches_all += matches
        for g in gammas:
            t, k = greedy_tokens_per_pass(matches, g)
            per_gamma[g][0] += t
            per_gamma[g][1] += k
    draft.train()
    return {"agreement": sum(matches_all) / max(1, len(matches_all)), "answer_tokens": len(matches_all),
            **{f"tokens_per_pass_g{g}": t / max(1, k) for g, (t, k) in per_gamma.items()}}


def train_draft(work: Path, budget_min: float, layers: int = 4, keep_vocab: int = 8192, batch: int = 8,
                lr: float = 3e-4, seed: int = 0, eval_every_s: float = 600.0, min_rows: int = 64,
                init_from: Path | None = None) -> dict:
    """Train (or resume) the trimmed-head draft. Without a checkpoint in ``work/draft``, ``init_from`` (an
    exported draft folder, e.g. the shipped assets/models/smollm2-135m/draft) starts it from those weights and
    their kept set, with a fresh optimizer, instead of from the target's first layers."""
    budget = budget_seconds(budget_min)
    if not 1 <= layers < 30:
        raise ExplorerError(f"--layers must be between 1 and 29 (got {layers})")
    rows = load_rows(work)
    if len(rows) < min_rows:
        raise ExplorerError(f"only {len(rows)} answers in {work / 'data'}; run the data stage first "
                            f"(at least {min_rows} needed)")
    target, tok = load_target(work)
    ckpt_path = work / "draft" / "ckpt.pt"
    ckpt_path.parent.mkdir(exist_ok=True)
    vocab = target.config.vocab_size
    init = None
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path)
        kept_ids, state = ckpt["kept_ids"], ckpt
        if ckpt["layers"] != layers:
            raise ExplorerError(f"{ckpt_path} holds a {ckpt['layers']}-layer draft; pass --layers {ckpt['layers']} "
                                "or move it away")
    elif init_from is not None:
        init = load_trimmed_draft(init_from, target, torch.float32)
        kept_ids, state, layers = init.kept_ids.clone(), None, init.config.num_hidden_layers
    else:
        counts = token_counts(work, tok, vocab)
        counts[tok.eos_token_id] += 1e9  # the end of turn must always be proposable
        kept_ids = counts.topk(min(keep_vocab, vocab)).indices.sort().values
        state = None
    draft = build_draft(target, kept_ids, layers)
    if init is not None:
        missing, unexpected = draft.load_state_dict({k: v.float() for k, v in init.state_dict().items()
                                                     if not k.startswith("model.embed_tokens")}, strict=False)
        if unexpected or [k for k in missing if not k.startswith("model.embed_tokens")]:
            raise ExplorerError(f"--init-from {init_from} does not match the draft ({unexpected[:2]}, {missing[:2]})")
    draft.model.embed_tokens.requires_grad_(False)
    trim_index = torch.full((vocab,), -1, dtype=torch.long)
    trim_index[kept_ids] = torch.arange(len(kept_ids))
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    progress = {"steps": 0, "tokens_seen": 0, "seconds": 0.0, "runs": 0}
    if state is not None:
        draft.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["opt"])
        progress = state["progress"]
    progress["runs"] += 1
    heldout = heldout_answers(work, target, tok)
    gen = torch.Generator().manual_seed(seed + progress["runs"])
    clock = RunClock(work, "draft", progress, lambda: evaluate_draft(draft, heldout),
                     lambda: save_draft_ckpt(ckpt_path, draft, opt, kept_ids, layers, progress), eval_every_s)
    clock.begin()
    start = time.time()
    bar = tqdm(desc="draft", total=int(budget), unit="s")
    done, step_in_run = False, 0
    while not done:
        rows = load_rows(work)  # the data stage may still be adding shards
        for ids, mask, positions, top_ids, top_lp in draft_batches(rows, batch, gen, tok.pad_token_id):
            elapsed = time.time() - start
            if elapsed > budget and step_in_run > 0:  # every run makes at least one step
                done = True
                break
            schedule_lr(opt, lr, step_in_run, elapsed / budget)
            logits, _ = draft.trimmed_logits(ids, attention_mask=mask, positions=positions)  # (N, K)
            loss = distill_topk_loss(logits, trim_index[top_ids], top_lp)
            optimizer_step(opt, params, loss)
            step_in_run += 1
            progress["steps"] += 1
            progress["tokens_seen"] += int(mask.sum())
            bar.update(int(time.time() - start) - bar.n)
            bar.set_postfix(loss=f"{loss.item():.3f}", tokens=progress["tokens_seen"])
            clock.tick()
    return clock.finish()


def save_draft_ckpt(path: Path, draft, opt, kept_ids, layers: int, progress: dict) -> None:
    state = {k: v for k, v in draft.state_dict().items() if not k.startswith("model.embed_tokens")}
    tmp = path.with_suffix(".tmp")
    torch.save({"model": state, "opt": opt.state_dict(), "kept_ids": kept_ids, "layers": layers,
                "progress": dict(progress)}, tmp)
    tmp.rename(path)
