"""How many tokens per pass could threshold decoding commit if the diffusion partner knew the target exactly?

    python benchmarks/diffusion_bound.py [--limit 12] [--tokens 64] [--block 8] [--thresholds 0.9,0.7] [--beam 8]

Threshold decoding (Fast-dLLM) commits a masked position when the model puts more than the threshold on one token
there, without seeing the masked positions before it. A partner that matched the target's joint distribution would
give position j + d the target's *marginal* over the d free tokens before it. This script follows the target's own
greedy answer (N = ``--tokens``, blocks of ``--block``, held-out chat prompts) and simulates a left-to-right oracle:
each pass commits the first masked position, then each following position of the block for as long as the greedy
token's marginal stays above the threshold. The marginal of position j + d is bounded from below by a beam over the
d free positions (the ``--beam`` most probable paths at each depth: sum over paths of p(path) p(token | path)), so
the oracle's count can only be too low by what the beam misses. Printed beside it: how often the target gives its
own greedy token more than the threshold (with the whole prefix known), and the cruder chain bound (the product of
those conditionals). The measured partner's number comes from ``benchmarks/diffusion_parallel.py``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from benchmarks.smollm2_card import heldout  # noqa: E402  (the same held-out prompts)
from explorer.decoding.api import encode_prompt  # noqa: E402


@torch.no_grad()
def extend(model, cache, ids: list[int] | torch.Tensor) -> torch.Tensor:
    """Feed ``ids`` (a list for one row, or a (B, 1) tensor) after ``cache``; the last position's probabilities."""
    x = torch.tensor([ids]) if isinstance(ids, list) else ids
    out = model(input_ids=x, past_key_values=cache, use_cache=True)
    return out.logits[:, -1].float().softmax(-1)


@torch.no_grad()
def marginals(model, cache, p0: torch.Tensor, answer: list[int], j: int, depth: int, beam: int,
              threshold: float) -> list[float]:
    """p0: the target's distribution at position j given the prefix in ``cache``. For d = 1 .. depth, a lower
    bound on the marginal of ``answer[j + d]`` with positions j .. j + d - 1 free; stops after the first below
    ``threshold`` (the oracle stops there)."""
    out = []
    mass, tokens = p0.topk(min(beam, p0.numel()))  # paths of length 1: (beam,)
    c = copy.deepcopy(cache)
    c.batch_repeat_interleave(len(tokens))
    probs = extend(model, c, tokens[:, None])  # (beam, V): p(x_{j+1} | path)
    for d in range(1, depth + 1):
        m = float((mass * probs[:, answer[j + d]]).sum())
        out.append(m)
        if m < threshold or d == depth:
            break
        joint = mass[:, None] * probs  # (beam, V)
        mass, flat = joint.flatten().topk(min(beam, joint.numel()))
        parent, tokens = flat // probs.shape[1], flat % probs.shape[1]
        c.batch_select_indices(parent)
        probs = extend(model, c, tokens[:, None])
    return out


def oracle(model, tok, prompt_ids: list[int], answer: list[int], block: int, threshold: float, beam: int):
    """Passes a left-to-right oracle makes over ``answer`` (see the module docstring), and the target's own
    greedy-token probabilities."""
    from transformers import DynamicCache  # deferred: only this benchmark builds caches by hand

    cache = DynamicCache()
    p = extend(model, cache, prompt_ids)[0]
    j, passes, own = 0, 0, []
    while j < len(answer):
        end = min(len(answer), (j // block + 1) * block)
        run = 1
        if end - j > 1:
            ms = marginals(model, cache, p, answer, j, end - j - 1, beam, threshold)
            run += next((i for i, m in enumerate(ms) if m < threshold), len(ms))
        passes += 1
        for t in answer[j:j + run]:  # commit: the prefix cache takes the committed tokens
            own.append(float(p[t]))
            p = extend(model, cache, [t])[0]
        j += run
    return passes, own


def chain_passes(own: list[float], block: int, threshold: float) -> int:
    """The chain bound: position j + d rides along while the product of the conditionals from j stays above."""
    j = passes = 0
    while j < len(own):
        end, run, prod = min(len(own), (j // block + 1) * block), 1, own[j]
        while j + run < end and prod * own[j + run] > threshold:
            prod *= own[j + run]
            run += 1
        j, passes = j + run, passes + 1
    return passes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--thresholds", default="0.9,0.7")
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = explorer.load_models("smollm2-135m@float32")
    model, tok = models.target, models.tokenizer
    rows = []
    for prompt in heldout(args.limit):
        ids, _ = encode_prompt(tok, prompt, chat=True)
        out = model.generate(torch.tensor([ids]), max_new_tokens=args.tokens, do_sample=False)[0, len(ids):].tolist()
        if tok.eos_token_id in out:  # the answer to its end-of-turn, as diffusion_parallel counts it
            out = out[:out.index(tok.eos_token_id) + 1]
        rows.append((prompt, ids, out))
    print(f"## The target's own confidence, and a left-to-right oracle's tokens per pass ({len(rows)} held-out "
          f"prompts, N = {args.tokens}, blocks of {args.block}, beam {args.beam})\n")
    print("| threshold | target's greedy token above it (prefix known) | chain bound: tokens / pass | "
          "oracle (target's marginals): tokens / pass | per prompt, median [min, max] |")
    print("|---|---|---|---|---|")
    for thr in (float(t) for t in args.thresholds.split(",")):
        tokens = passes = chain = 0
        above, per = [], []
        for _, ids, answer in rows:
            n, own = oracle(model, tok, ids, answer, args.block, thr, args.beam)
            tokens, passes, chain = tokens + len(answer), passes + n, chain + chain_passes(own, args.block, thr)
            above += [q > thr for q in own]
            per.append(len(answer) / n)
        print(f"| {thr} | {sum(above) / len(above):.0%} | {tokens / chain:.2f} | **{tokens / passes:.2f}** | "
              f"{statistics.median(per):.2f} [{min(per):.2f}, {max(per):.2f}] |")


if __name__ == "__main__":
    main()
