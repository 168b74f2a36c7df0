"""Stage 3: the target adapted to masked diffusion (bidirectional, shifted logits, LoRA)."""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tqdm import tqdm

from explorer.compact_weights import load_weights
from explorer.errors import ExplorerError
from explorer.runtime import make_bidirectional
from explorer.training.smollm2.common import (
    RunClock,
    budget_seconds,
    heldout_answers,
    load_rows,
    load_target,
)
from explorer.training.smollm2.selfdata import SELF_FOLDER
from explorer.training.smollm2.store import load_shard, shard_paths

MASK_TOKEN = "<empty_output>"  # a special token that never occurs in chat answers: reused as [MASK]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DIFFUSION_ANSWER_TOKENS = 64  # answers are cropped to this many tokens (the canvas the model learns)


def build_diffusion(target, tok, rank: int):
    """A bidirectional copy of the target with LoRA adapters and a trainable [MASK] input embedding."""
    from peft import LoraConfig, get_peft_model  # deferred: peft (~2.7 s to import)

    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN)
    model = make_bidirectional(copy.deepcopy(target))
    model.config.shift_logits, model.config.mask_token_id = True, mask_id
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                             target_modules=LORA_TARGETS))
    base = model.get_base_model()
    mask_vec = torch.nn.Parameter(base.get_input_embeddings().weight[mask_id].detach().clone())

    def put_mask_embedding(module, inputs, output):
        return torch.where((inputs[0] == mask_id)[..., None], mask_vec.to(output.dtype), output)

    base.get_input_embeddings().register_forward_hook(put_mask_embedding)
    return model, mask_vec, mask_id


def choose_masks(n: int, t: float, gen: torch.Generator, block: int = 8,
                 blocks_only: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Which answer positions are masked, which are scored, and the normaliser.

    Half the time MDLM/LLaDA masking: each position masked with probability t, all scored, the loss
    normalised by t * n (the ELBO's 1/t weight). The other half the situation semi-autoregressive
    decoding meets (block diffusion, Arriola et al. 2025): a clean prefix of random length, one block
    masked with probability t, everything after it masked; only the block is scored, normalised by
    t * block. ``blocks_only``: always the second (the certainty stage trains what threshold decoding meets).
    """
    if not blocks_only and float(torch.rand((), generator=gen)) < 0.5:
        masked = torch.rand(n, generator=gen) < t
        if not masked.any():
            masked[torch.randint(n, (1,), generator=gen)] = True
        return masked, masked, n
    cut = int(torch.randint(n, (1,), generator=gen))
    end = min(n, cut + block)
    masked = torch.zeros(n, dtype=torch.bool)
    masked[cut:end] = torch.rand(end - cut, generator=gen) < t
    if not masked[cut:end].any():
        masked[cut + int(torch.randint(end - cut, (1,), generator=gen))] = True
    masked[end:] = True
    scored = masked.clone()
    scored[end:] = False
    return masked, scored, end - cut


def masked_diffusion_loss(model, prompt_ids: list[int], answer: list[int], mask_id: int, t: float,
                          gen: torch.Generator, certainty: float = 0.0) -> torch.Tensor:
    """The masked-diffusion loss of one sequence (``choose_masks``): cross-entropy at the scored masks,
    logits shifted by one (position j-1 predicts token j), divided by t times the normaliser.

    ``certainty`` > 0 is certainty forcing (dParallel, Chen et al. 2025): block masks only, and the entropy
    of the model's distribution at every scored mask it already predicts correctly (argmax = the answer's
    token) is added with that weight, so a right guess becomes a confident one and threshold decoding can
    commit several positions per pass; the cross-entropy keeps the guesses right.
    """
    base = model.get_base_model()
    x0 = torch.tensor(prompt_ids + answer)
    p = len(prompt_ids)
    masked, scored, norm = choose_masks(len(answer), t, gen, blocks_only=certainty > 0)
    xt = x0.clone()
    xt[p:][masked] = mask_id
    hidden = base.model(input_ids=xt[None]).last_hidden_state[0]  # (T, H)
    where = p + scored.nonzero()[:, 0]  # absolute positions scored
    logits = base.lm_head(hidden[where - 1]).float()  # (M, V)
    loss = F.cross_entropy(logits, x0[where], reduction="sum")
    if certainty > 0:
        logp = logits.log_softmax(-1)
        right = logits.argmax(-1) == x0[where]
        entropy = -(logp.exp() * logp).sum(-1)
        loss = loss + certainty * entropy[right].sum()
    return loss / (t * norm)


def answer_window(prompt_ids: list[int], answer: list[int], length: int, gen: torch.Generator,
                  block: int = 8) -> tuple[list[int], list[int]]:
    """Half the time the answer's first ``length`` tokens; otherwise a window starting at a random multiple
    of ``block`` inside the answer, the answer before it joined to the prompt as clean context (what a canvas
    longer than ``length`` meets once its first blocks are committed)."""
    starts = range(0, max(1, len(answer) - block), block)
    if len(starts) < 2 or float(torch.rand((), generator=gen)) < 0.5:
        return prompt_ids, answer
    s = starts[int(torch.randint(1, len(starts), (1,), generator=gen))]
    return prompt_ids + answer[:s], answer[s:]


def crop_answer(answer: list[int], eos_id: int, length: int) -> list[int]:
    """The first ``length`` answer tokens; a shorter answer is padded with end-of-turn tokens
    (LLaDA's SFT recipe: the model learns to fill the rest of the canvas with EOS)."""
    return answer[:length] + [eos_id] * max(0, length - len(answer))


@torch.no_grad()
def evaluate_diffusion(model, heldout: list[dict], mask_id: int, eos_id: int, ts=(0.25, 0.5, 0.75)) -> dict:
    """Held-out diffusion loss (``masked_diffusion_loss``, nats per token) at fixed mask ratios, seeded; and
    what threshold decoding at 0.9 would commit on a block's first pass (clean prefix, the whole block of 8
    masked, every later position masked): how many of its positions reach probability 0.9 (``sure_per_block``)
    and how many of those are the answer's token (``sure_right``)."""
    model.eval()
    out = {}
    for t in ts:
        gen = torch.Generator().manual_seed(1234)
        total, count = 0.0, 0
        for r in heldout[:12]:
            answer = crop_answer(r["answer_ids"], eos_id, DIFFUSION_ANSWER_TOKENS)
            loss = float(masked_diffusion_loss(model, r["prompt_ids"], answer, mask_id, t, gen))
            total, count = total + loss, count + 1
        out[f"masked_ce_t{t}"] = total / count
    base, sure, right, blocks = model.get_base_model(), 0, 0, 0
    for r in heldout[:12]:
        answer = crop_answer(r["answer_ids"], eos_id, DIFFUSION_ANSWER_TOKENS)
        p = len(r["prompt_ids"])
        for cut in range(0, len(answer), 16):  # every other block
            x = torch.tensor(r["prompt_ids"] + answer[:cut] + [mask_id] * (len(answer) - cut))
            hidden = base.model(input_ids=x[None]).last_hidden_state[0, p + cut - 1:p + cut + 7]
            prob, guess = base.lm_head(hidden).float().softmax(-1).max(-1)
            ok = prob >= 0.9
            sure += int(ok.sum())
            right += int((ok & (guess == torch.tensor(answer[cut:cut + 8]))).sum())
            blocks += 1
    out["sure_per_block"], out["sure_right"] = sure / blocks, right / max(1, sure)
    model.train()
    return out


def load_exported_diffusion(model, mask_vec, folder: Path, rank: int) -> None:
    """Start from an exported adapter (``assets/models/smollm2-135m/diffusion``): its LoRA factors and [MASK]
    embedding, for a work dir without a checkpoint (the optimizer starts fresh)."""
    from peft import set_peft_model_state_dict  # deferred: peft (~2.7 s to import)

    folder = Path(folder)
    if not (folder / "adapter_model.safetensors").exists():
        raise ExplorerError(f"--init-from {folder} holds no adapter_model.safetensors")
    cfg = json.loads((folder / "adapter_config.json").read_text())
    if cfg.get("r") != rank:
        raise ExplorerError(f"--init-from {folder} holds a rank-{cfg.get('r')} adapter; "
                            f"pass --lora-rank {cfg.get('r')}")
    set_peft_model_state_dict(model, load_weights(folder / "adapter_model.safetensors"))
    with torch.no_grad():
        mask_vec.copy_(load_file(str(folder / "mask_embedding.safetensors"))["mask_embedding"].float())


def training_rows(work: Path, certainty: float, self_mix: float = 0.0,
                  gen: torch.Generator | None = None) -> list[dict]:
    """The answers a pass over the data trains on: all of them, or with certainty forcing the target's greedy ones;
    with ``self_mix`` > 0 the partner's own answers (``selfdata``) are that fraction of the rows, the target's
    greedy answers (a random subset, ``gen``) the rest."""
    rows = load_rows(work)
    rows = [r for r in rows if r.get("temperature", 0.0) == 0.0] if certainty > 0 else rows
    if self_mix <= 0:
        return rows
    own = [r for path in shard_paths(work / SELF_FOLDER).values() for r in load_shard(path)]
    want = min(len(rows), int(round(len(own) * (1 - self_mix) / self_mix))) if self_mix < 1 else 0
    pick = torch.randperm(len(rows), generator=gen)[:want].tolist()
    return own + [rows[i] for i in pick]


def train_diffusion(work: Path, budget_min: float, rank: int = 16, batch: int = 4, lr: float = 5e-4,
                    seed: int = 0, eval_every_s: float = 900.0, min_rows: int = 64,
                    init_from: Path | None = None, bf16: bool = False, certainty: float = 0.0,
                    self_mix: float = 0.0) -> dict:
    """Train (or resume) the diffusion adapter for ``budget_min`` minutes. ``bf16``: forward and backward
    under bfloat16 autocast (worth it only on a CPU with native bf16); the weights and optimizer stay fp32.
    ``certainty`` > 0: certainty forcing (``masked_diffusion_loss``) on the greedy answers only (a sampled
    answer is uncertain by design), windows anywhere in the answer (``answer_window``). ``self_mix``: that fraction
    of the rows are the partner's own answers (``selfdata``: self-distillation), the rest the target's."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict  # deferred: peft (~2.7 s to import)

    budget = budget_seconds(budget_min)
    if not 0 <= self_mix <= 1:
        raise ExplorerError(f"--self-mix must be between 0 and 1 (got {self_mix})")
    if self_mix > 0 and not shard_paths(work / SELF_FOLDER):
        raise ExplorerError(f"no answers of the partner's own in {work / SELF_FOLDER}; run the selfdata stage first")
    rows = training_rows(work, certainty, self_mix)
    if len(rows) < min_rows:
        raise ExplorerError(f"only {len(rows)} answers in {work / 'data'}; run the data stage first "
                            f"(at least {min_rows} needed)")
    target, tok = load_target(work)
    model, mask_vec, mask_id = build_diffusion(target, tok, rank)
    eos = tok.eos_token_id
    params = [p for p in model.parameters() if p.requires_grad] + [mask_vec]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    ckpt_path = work / "diffusion" / "ckpt.pt"
    ckpt_path.parent.mkdir(exist_ok=True)
    progress = {"steps": 0, "sequences": 0, "answer_tokens_seen": 0, "seconds": 0.0, "runs": 0, "rank": rank}
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path)
        if ckpt["progress"]["rank"] != rank:
            raise ExplorerError(f"{ckpt_path} holds a rank-{ckpt['progress']['rank']} adapter; pass --lora-rank "
                                f"{ckpt['progress']['rank']} or move it away")
        set_peft_model_state_dict(model, ckpt["lora"])
        with torch.no_grad():
            mask_vec.copy_(ckpt["mask_vec"])
        opt.load_state_dict(ckpt["opt"])
        progress = ckpt["progress"]
    elif init_from is not None:
        load_exported_diffusion(model, mask_vec, init_from, rank)
        report = Path(init_from).parent / "train_report.json"
        if report.exists():  # carry the exported run's counters, so tokens seen keep adding up
            old = json.loads(report.read_text()).get("diffusion", {})
            progress.update({k: old[k] for k in ("steps", "sequences", "answer_tokens_seen", "seconds", "runs")
                             if k in old})
        progress["init_from"] = str(init_from)
    progress["runs"] += 1
    if self_mix > 0:
        progress["self_mix"] = self_mix
        progress.setdefault("self_from_step", progress["steps"])
    if certainty > 0:
        progress["certainty"] = certainty
        progress.setdefault("certainty_from_step", progress["steps"])
    heldout = heldout_answers(work, target, tok)
    gen = torch.Generator().manual_seed(seed + 7919 * progress["runs"])
    model.train()

    def save():
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"lora": get_peft_model_state_dict(model), "mask_vec": mask_vec.detach().clone(),
                    "mask_id": mask_id, "opt": opt.state_dict(), "progress": dict(progress)}, tmp)
        tmp.rename(ckpt_path)

    clock = RunClock(work, "diffusion", progress, lambda: evaluate_diffusion(model, heldout, mask_id, eos), save,
                     eval_every_s)
    clock.begin()
    start = time.time()

    bar = tqdm(desc="diffusion", total=int(budget), unit="s")
    step_in_run, done = 0, False
    while not done:
        rows = training_rows(work, certainty, self_mix, gen)  # read again each pass: the data may grow meanwhile
        order = torch.randperm(len(rows), generator=gen).tolist()
        for start_i in range(0, len(order) - batch + 1, batch):
            elapsed = time.time() - start
            if elapsed > budget and step_in_run > 0:  # every run makes at least one step
                done = True
                break
            warm = min(1.0, (step_in_run + 1) / 10)
            for g in opt.param_groups:
                g["lr"] = lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * elapsed / budget)))
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for i in order[start_i:start_i + batch]:  # one sequence per pass: no padding in the attention
                prompt, answer = rows[i]["prompt_ids"], rows[i]["answer_ids"]
                if certainty > 0:
                    prompt, answer = answer_window(prompt, answer, DIFFUSION_ANSWER_TOKENS, gen)
                answer = crop_answer(answer, eos, DIFFUSION_ANSWER_TOKENS)
                t = float(torch.rand((), generator=gen)) * (1 - 1e-3) + 1e-3
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = masked_diffusion_loss(model, prompt, answer, mask_id, t, gen, certainty) / batch
                loss.backward()
                total += float(loss.detach())
                progress["answer_tokens_seen"] += len(answer)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step_in_run += 1
            progress["steps"] += 1
            progress["sequences"] += batch
            bar.update(int(time.time() - start) - bar.n)
            bar.set_postfix(loss=f"{total:.3f}", tokens=progress["answer_tokens_seen"])
            clock.tick()
    return clock.finish()
