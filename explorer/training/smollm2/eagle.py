"""Stage 2b: an EAGLE head for SmolLM2-135M, trained on the target's own features.

Features: one teacher-forced target pass over each distilled answer gives f_i (the final hidden
state, after the norm) at every position, extracted the first time a shard is trained on and cached per shard
in ``work/eagle/feats`` (fp16; ``feats-fused-2-14`` with EAGLE-3's fused layers' outputs before f_i); each
pass over the data takes the shards without features (new answers) first,
so a run on a grown data set spends its time on answers the head has not seen, not on extracting them all up front.
Training: ``EagleHead.forward_depths`` unrolls ``depths`` drafting steps at every position (EAGLE-3's
training-time test); the loss at step d, position i is the KL divergence from the target's
distribution of x_{i+2} (its LM head on the true f_{i+1}, over the kept tokens) to the head's (the
same LM head on the predicted feature). Only answer positions whose chain starts at or after the
last prompt token count. Budgeted, checkpointed every five minutes, resumable.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from explorer.errors import ExplorerError
from explorer.families.eagle import build_eagle_head, load_eagle_head
from explorer.training.smollm2.common import (
    RunClock,
    budget_seconds,
    heldout_answers,
    load_target,
    optimizer_step,
    schedule_lr,
)
from explorer.training.smollm2.draft import token_counts
from explorer.training.smollm2.store import load_shard, shard_paths

FUSE_LAYERS = (2, 14)  # EAGLE-3's low and middle layers of SmolLM2-135M's 30 (the high one is the final feature)
FUSE_LR_SCALE = 3.0


@torch.no_grad()
def target_features(target, seqs: list[list[int]], batch: int = 8, bf16: bool = False,
                    fuse_layers: tuple[int, ...] = ()) -> list[torch.Tensor]:
    """The target's final hidden states (after the norm), one (len, H) fp16 tensor per sequence, or with
    ``fuse_layers`` (len, (n + 1) H): those decoder layers' outputs, then the final feature (EAGLE-3; a middle
    layer's outputs reach ~25,000 in SmolLM2-135M, so they are clipped to float16's range, 65,504). ``bf16``
    runs the pass under bfloat16 autocast (about twice as fast on a CPU with native bf16; ~1% relative error,
    the size of the difference between the float32 target and the reduced-precision one the app drafts from)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[torch.Tensor | None] = [None] * len(seqs)
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        width = max(len(seqs[i]) for i in idx)
        ids = torch.zeros((len(idx), width), dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for b, i in enumerate(idx):
            ids[b, :len(seqs[i])] = torch.tensor(seqs[i])
            mask[b, :len(seqs[i])] = 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            res = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=bool(fuse_layers))
        # hidden_states[l + 1] is decoder layer l's output (the last entry is the final norm's)
        hidden = torch.cat([*(res.hidden_states[i + 1] for i in fuse_layers), res.last_hidden_state], -1)
        for b, i in enumerate(idx):
            out[i] = hidden[b, :len(seqs[i])].clamp(-65000, 65000).to(torch.float16).clone()
    return out


def sequence(row: dict) -> list[int]:
    """prompt + answer without its last token: the positions whose features the head reads."""
    return row["prompt_ids"] + row["answer_ids"][:-1]


def features_dir(work: Path, fuse_layers: tuple[int, ...] = ()) -> Path:
    """Where a shard's features are cached: ``eagle/feats`` (final features), ``eagle/feats-fused-2-14`` (fused)."""
    return work / "eagle" / ("feats-fused-" + "-".join(map(str, fuse_layers)) if fuse_layers else "feats")


def shard_features(work: Path, target, shard: Path, bf16: bool = False,
                   fuse_layers: tuple[int, ...] = ()) -> list[tuple[dict, torch.Tensor]]:
    """(row, features) for every answer of one data shard, extracted on first use and cached."""
    feats_dir = features_dir(work, fuse_layers)
    feats_dir.mkdir(parents=True, exist_ok=True)
    rows = load_shard(shard)
    cached = feats_dir / f"{shard.stem}.pt"
    if not cached.exists():
        feats = target_features(target, [sequence(r) for r in rows], bf16=bf16, fuse_layers=fuse_layers)
        torch.save(feats, cached.with_suffix(".tmp"))
        cached.with_suffix(".tmp").rename(cached)
    return list(zip(rows, torch.load(cached), strict=True))


def shard_plan(work: Path, gen: torch.Generator, fuse_layers: tuple[int, ...] = ()) -> list[Path]:
    """One pass over the data: the shards whose features are not cached yet (answers the head has not
    trained on) first, then the others, each part in random order. Read again every pass, so shards the data
    stage adds meanwhile join the next one."""
    feats_dir = features_dir(work, fuse_layers)
    shards = list(shard_paths(work / "data").values())
    fresh = [s for s in shards if not (feats_dir / f"{s.stem}.pt").exists()]
    seen = [s for s in shards if (feats_dir / f"{s.stem}.pt").exists()]
    return [part[i] for part in (fresh, seen) for i in torch.randperm(len(part), generator=gen).tolist()]


def batch_tensors(pairs: list[tuple[dict, torch.Tensor]]):
    """Right-padded (next_ids (B, T), feats (B, T, H), prompt lengths, answer lengths)."""
    width = max(f.shape[0] for _, f in pairs)
    hidden = pairs[0][1].shape[1]
    next_ids = torch.zeros((len(pairs), width), dtype=torch.long)
    feats = torch.zeros((len(pairs), width, hidden))
    for b, (row, f) in enumerate(pairs):
        seq = row["prompt_ids"] + row["answer_ids"]
        next_ids[b, :len(seq) - 1] = torch.tensor(seq[1:])
        feats[b, :f.shape[0]] = f.float()
    return next_ids, feats, [len(r["prompt_ids"]) for r, _ in pairs], [f.shape[0] for _, f in pairs]


def loss_positions(prompt_lens: list[int], lengths: list[int], depth: int, width: int) -> torch.Tensor:
    """(B, T) mask of positions i whose depth-``depth`` prediction (of x_{i+2}) is scored: the chain
    starts at i - depth >= p - 1, and f_{i+1} exists (i + 1 < length)."""
    i = torch.arange(width)[None]
    p = torch.tensor(prompt_lens)[:, None]
    n = torch.tensor(lengths)[:, None]
    return (i - depth >= p - 1) & (i + 1 < n)


def depth_losses(head, next_ids, feats, prompt_lens, lengths, depths: int, sample: int | None = 512,
                 gen: torch.Generator | None = None) -> list[torch.Tensor]:
    """Per drafting step: KL(target || head) over the kept tokens at ``sample`` random scored positions
    (the LM head over 16k tokens dominates the cost), plus a smooth-L1 feature regression at all of
    them (EAGLE's two terms)."""
    outs = head.forward_depths(next_ids, feats, depths)
    losses = []
    for d, out in enumerate(outs):
        mask = loss_positions(prompt_lens, lengths, d, feats.shape[1])[:, :-1]
        predicted, true = out[:, :-1][mask], feats[:, 1:, -out.shape[-1]:][mask]  # (N, H): f^_{i+1}, f_{i+1}
        pick = torch.randperm(len(true), generator=gen)[:sample] if sample else slice(None)
        with torch.no_grad():
            teacher = torch.log_softmax(head.kept_logits(true[pick]), -1)
        student = torch.log_softmax(head.kept_logits(predicted[pick]), -1)
        kl = (teacher.exp() * (teacher - student)).sum(-1).mean()
        losses.append(kl + torch.nn.functional.smooth_l1_loss(predicted, true))
    return losses


@torch.no_grad()
def evaluate_eagle(head, pairs, gammas=(1, 2, 3, 4), batch: int = 8) -> dict:
    """Greedy speculative decoding along the target's held-out greedy answers, exactly as the drafter
    would run it: the prefill gives the first token; each later pass drafts a chain from the last
    verified feature and keeps the run of drafts equal to the answer, plus one target token."""
    head.eval()
    depth = max(gammas)
    hits = [[0, 0] for _ in range(depth)]
    per_gamma = {g: [0, 0] for g in gammas}
    kl = [0.0, 0]  # KL(target || head) at drafting step 1 over the kept tokens: a smooth learning curve
    for start in range(0, len(pairs), batch):
        chunk = pairs[start:start + batch]
        next_ids, feats, plens, lens = batch_tensors(chunk)
        outs = head.forward_depths(next_ids, feats, depth)
        mask = loss_positions(plens, lens, 0, feats.shape[1])[:, :-1]
        teacher = torch.log_softmax(head.kept_logits(feats[:, 1:, -outs[0].shape[-1]:][mask]), -1)
        student = torch.log_softmax(head.kept_logits(outs[0][:, :-1][mask]), -1)
        kl[0] += float((teacher.exp() * (teacher - student)).sum())
        kl[1] += int(mask.sum())
        preds = [head.kept_ids[head.kept_logits(o).argmax(-1)] for o in outs]  # (B, T) predicted x_{i+2}
        for b, (row, _) in enumerate(chunk):
            p, answer = plens[b], row["answer_ids"]
            seq = row["prompt_ids"] + answer

            def match(d, i, b=b, seq=seq, preds=preds):
                return bool(preds[d][b, i] == seq[i + 2])

            for d in range(depth):
                for i in range(p - 1 + d, p + len(answer) - 2):
                    hits[d][0] += match(d, i)
                    hits[d][1] += 1
            for g in gammas:
                a, passes, end = p + 1, 1, p + len(answer)  # the prefill pass emits answer[0]
                while a < end:
                    run = 0
                    while run < g and a + run < end and match(run, a - 2 + run):
                        run += 1
                    a += run + 1
                    passes += 1
                per_gamma[g][0] += len(answer)
                per_gamma[g][1] += passes
    head.train()
    return {"agreement": hits[0][0] / max(1, hits[0][1]), "kl_step1": round(kl[0] / max(1, kl[1]), 6),
            "acceptance_by_depth": [round(h / max(1, n), 4) for h, n in hits],
            **{f"tokens_per_pass_g{g}": round(t / max(1, k), 4) for g, (t, k) in per_gamma.items()}}


def heldout_pairs(work: Path, target, tok, fuse_layers: tuple[int, ...] = ()) -> list[tuple[dict, torch.Tensor]]:
    path = features_dir(work, fuse_layers) / "heldout.pt"
    rows = heldout_answers(work, target, tok)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(target_features(target, [sequence(r) for r in rows], fuse_layers=fuse_layers), path)
    return list(zip(rows, torch.load(path), strict=True))


def train_eagle(work: Path, budget_min: float, keep_vocab: int = 16384, depths: int = 3, batch: int = 8,
                lr: float = 5e-4, seed: int = 0, eval_every_s: float = 600.0, min_rows: int = 64,
                init_from: Path | None = None, bf16: bool = False, shards_per_step: int = 4,
                fuse_layers: tuple[int, ...] = ()) -> dict:
    """Train (or resume) the EAGLE head. Without a checkpoint, ``init_from`` (an exported head folder) gives its
    weights, kept vocabulary and counters; ``bf16`` runs forward and backward under bfloat16 autocast.
    ``fuse_layers`` (e.g. ``FUSE_LAYERS``) gives the head EAGLE-3's fused features; a head trained without them (a
    checkpoint or ``init_from``) carries over unchanged, its optimizer state dropped; a fused checkpoint stays as
    it was fused."""
    budget = budget_seconds(budget_min)
    if not 1 <= depths <= 8:
        raise ExplorerError(f"--depths must be between 1 and 8 (got {depths})")
    if not list(shard_paths(work / "data")):
        raise ExplorerError(f"no answers in {work / 'data'}; run the data stage first")
    target, tok = load_target(work)
    vocab = target.config.vocab_size
    ckpt_path = work / "eagle" / "ckpt.pt"
    ckpt_path.parent.mkdir(parents=True, exist_ok=True)
    state = torch.load(ckpt_path) if ckpt_path.exists() else None
    if state is None and init_from is not None:
        shipped = load_eagle_head(Path(init_from), target, torch.float32)
        report = Path(init_from).parent / "train_report.json"
        old = json.loads(report.read_text()).get("eagle", {}) if report.exists() else {}
        state = {"kept_ids": shipped.kept_ids.clone(), "model": shipped.state_dict(), "opt": None,
                 "fuse_layers": shipped.fuse_layers,
                 "progress": {"steps": old.get("steps", 0), "tokens_seen": old.get("tokens_seen", 0),
                              "seconds": old.get("seconds", 0.0), "runs": old.get("runs", 0),
                              "init_from": str(init_from)}}
    if state is not None:
        kept_ids = state["kept_ids"]
    else:
        counts = token_counts(work, tok, vocab)
        counts[tok.eos_token_id] += 1e9  # the end of turn must always be proposable
        kept_ids = counts.topk(min(keep_vocab, vocab)).indices.sort().values
    had = tuple(state.get("fuse_layers", ())) if state is not None else ()
    fuse_layers = had or tuple(fuse_layers)
    head = build_eagle_head(target, kept_ids, fuse_layers)
    named = [(n, p) for n, p in head.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    # the fusion's weights start at zero beside a trained head: they learn at FUSE_LR_SCALE times its rate
    groups = [{"params": [p for n, p in named if not n.startswith("fuse")]},
              {"params": [p for n, p in named if n.startswith("fuse")], "lr_scale": FUSE_LR_SCALE}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    progress = {"steps": 0, "tokens_seen": 0, "seconds": 0.0, "runs": 0}
    if state is not None:
        missing, unexpected = head.load_state_dict(state["model"], strict=False)
        if unexpected or any(not k.startswith("fuse") for k in missing):
            raise ExplorerError(f"the EAGLE checkpoint does not fit the head ({missing[:3]}, {unexpected[:3]})")
        if state["opt"] is not None and not missing:  # a head that just gained fusion starts a new optimizer
            opt.load_state_dict(state["opt"])
        progress = state["progress"]
        if fuse_layers and not had:
            progress["fused_from_step"] = progress["steps"]
    progress["fuse_layers"] = list(fuse_layers)
    progress["runs"] += 1
    heldout = heldout_pairs(work, target, tok, fuse_layers)
    gen = torch.Generator().manual_seed(seed + progress["runs"])
    rows = sum(len(load_shard(s)) for s in shard_paths(work / "data").values())
    if rows < min_rows:
        raise ExplorerError(f"only {rows} answers in {work / 'data'} (at least {min_rows} needed)")
    clock = RunClock(work, "eagle", progress, lambda: evaluate_eagle(head, heldout),
                     lambda: save_eagle_ckpt(ckpt_path, head, opt, kept_ids, progress, fuse_layers), eval_every_s)
    clock.begin(answers=rows)
    start = time.time()
    bar = tqdm(desc="eagle", total=int(budget), unit="s")
    done, step_in_run = False, 0
    weights = [0.8 ** d for d in range(depths)]
    while not done:  # one pass over the data per loop, shards_per_step shards' answers shuffled together
        plan = shard_plan(work, gen, fuse_layers)
        for g in range(0, len(plan), shards_per_step):
            pairs = [p for shard in plan[g:g + shards_per_step]
                     for p in shard_features(work, target, shard, bf16, fuse_layers)]
            order = torch.randperm(len(pairs), generator=gen).tolist()
            for s in range(0, len(order), batch):
                elapsed = time.time() - start
                if elapsed > budget and step_in_run > 0:  # every run makes at least one step
                    done = True
                    break
                schedule_lr(opt, lr, step_in_run, elapsed / budget)
                next_ids, feats, plens, lens = batch_tensors([pairs[i] for i in order[s:s + batch]])
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    losses = depth_losses(head, next_ids, feats, plens, lens, depths, gen=gen)
                loss = sum(w * x for w, x in zip(weights, losses, strict=True)) / sum(weights)
                optimizer_step(opt, params, loss)
                step_in_run += 1
                progress["steps"] += 1
                progress["tokens_seen"] += int(sum(lens))
                bar.update(int(time.time() - start) - bar.n)
                bar.set_postfix(kl=" ".join(f"{x.item():.2f}" for x in losses), tokens=progress["tokens_seen"])
                clock.tick()
            if done:
                break
    return clock.finish()


def save_eagle_ckpt(path: Path, head, opt, kept_ids, progress: dict, fuse_layers: tuple[int, ...] = ()) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": head.state_dict(), "opt": opt.state_dict(), "kept_ids": kept_ids,
                "fuse_layers": tuple(fuse_layers), "progress": dict(progress)}, tmp)
    tmp.rename(path)
