"""Speculative decoding over a token tree: draft a tree, verify every node in one target pass, keep a path.

The drafter (a small causal LM, the target's first layers, or a family's drafter such as EAGLE's head:
``families/eagle/tree.py``) expands the tree level by level with its own KV cache and a tree mask, so one
draft pass computes the next distribution of every node it feeds. A static shape ("3,2,1") gives every node at
depth d - 1 b_d children; a dynamic one ("dynamic:16") grows the tree best-first by cumulative draft
log-probability, as EAGLE-2 (Li et al. 2024, Sec. 4) but causally: a node is added before its token is drawn and
nothing is pruned afterwards, so the shape never depends on a token it then keeps, and verification
(``tree.verify_tree``) stays exact. Children are drawn from the draft without replacement (at T = 0: the
draft's top-k in order). After the verify pass both KV caches are compacted to the prefix plus the accepted
path (``tree.select_cache``).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Generator
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache

from explorer.decoding.acceptance import cut_emitted
from explorer.decoding.config import DecodeConfig, TreeShape, parse_tree
from explorer.decoding.draft import observe
from explorer.decoding.drafters import ModelDrafter, make_drafter
from explorer.decoding.events import DecodeResult, Event, Proposal, Verification
from explorer.decoding.registry import family_drafter
from explorer.decoding.sampling import make_generator, sample, warp_logits
from explorer.decoding.tree import (
    DraftTree,
    additive_mask,
    node_mask,
    select_cache,
    tree_depths,
    verify_inputs,
    verify_tree,
)
from explorer.errors import ExplorerError
from explorer.runtime import Models, timed_forward


@dataclass
class _Children:
    """How the next child of one node is drawn: the draft's distribution there, minus the children drawn."""

    q: torch.Tensor  # (V,) warped draft distribution at the node
    probs: torch.Tensor  # (V,) softmax at temperature 1 (ranks and shows children at T = 0)
    greedy: bool
    cum: float  # cumulative draft log-probability of the node
    left: torch.Tensor = field(init=False)  # (V,) T > 0: the mass not yet drawn; T = 0: ranks not yet used
    drawn: int = 0

    def __post_init__(self):
        # greedy: the ranks, 16 at first (a full sort of the vocabulary per node costs more than the drafting)
        self.left = torch.topk(self.probs, min(16, self.probs.shape[-1])).indices if self.greedy else self.q.clone()

    def next_prob(self) -> float:
        """The draft probability of the likeliest child not yet drawn (0 when none is left)."""
        if self.greedy:
            if self.drawn == len(self.left) < self.probs.shape[-1]:
                self.left = torch.argsort(self.probs, descending=True)
            return float(self.probs[self.left[self.drawn]]) if self.drawn < len(self.left) else 0.0
        return float(self.left.max())

    def draw(self, gen: torch.Generator) -> tuple[int, torch.Tensor, float] | None:
        """(token, the distribution it was drawn from, its draft probability), or None when nothing is left."""
        if self.next_prob() <= 0:
            return None
        if self.greedy:  # the draft's next best token, chosen deterministically (a one-hot q)
            token = int(self.left[self.drawn])
            row = torch.zeros(self.q.shape[-1], device=self.q.device)
            row[token] = 1.0
        else:  # without replacement: the draft's q with the siblings drawn so far removed, renormalized
            row = self.left / self.left.sum()
            token = sample(row, gen)
            self.left[token] = 0.0
        self.drawn += 1
        return token, row, float(self.probs[token] if self.greedy else self.q[token])


@dataclass
class TreeDrafter:
    """A small causal LM (or the target's first layers) drafting a token tree with its own KV cache."""

    model: nn.Module
    eos_id: int | None
    name: str = "model"
    cache: DynamicCache = field(default_factory=DynamicCache)
    slots: dict[int, int] = field(default_factory=dict)  # tree node -> its position in the draft's cache

    def propose_tree(self, tokens: list[int], shape: TreeShape, max_depth: int, cfg: DecodeConfig,
                     gen: torch.Generator) -> DraftTree:
        """Draft a tree after ``tokens`` (depth <= ``max_depth``); every node's q is what it was drawn from."""
        tree, self.slots = DraftTree(), {}
        if max_depth < 1:
            return tree
        root = self._root(tokens, tree)
        if root is None:  # nothing to draft from yet (an EAGLE head before the prefill's features)
            return tree
        open_nodes = {-1: self._children(root, cfg, 0.0)}
        depth_limit = min(max_depth, shape.max_depth)
        for level in range(1, depth_limit + 1):
            added = self._grow(tree, open_nodes, shape, level, gen)
            if not added:
                break
            depths = tree_depths(tree.parents)
            expandable = [i for i in added if depths[i] < depth_limit and tree.tokens[i] != self.eos_id]
            if len(tree) >= shape.max_nodes or not expandable or (not shape.budget and level == depth_limit):
                break
            rows = self._feed(tree, expandable, len(tokens))
            for node, row in zip(expandable, rows, strict=True):
                cum = open_nodes[tree.parents[node]].cum + math.log(max(tree.shown[node], 1e-30))
                open_nodes[node] = self._children(row, cfg, cum)
        return tree

    def _root(self, tokens: list[int], tree: DraftTree) -> torch.Tensor | None:
        """The draft's next-token logits (V,) after ``tokens``: one pass over what the draft has not seen."""
        feed = tokens[self.cache.get_seq_length():]  # everything the draft has not seen: its last row is the root
        logits, dt = timed_forward(self.model, torch.tensor([feed], device=self.model.device), self.cache, keep=1)
        tree.forward_s, tree.passes = dt, 1
        return logits[0, -1]

    def _children(self, logits: torch.Tensor, cfg: DecodeConfig, cum: float) -> _Children:
        probs = torch.softmax(logits.float(), -1)
        if cfg.temperature == 0:  # greedy children are the draft's top ranks; their q is one-hot (``draw``)
            return _Children(probs, probs, True, cum)
        return _Children(warp_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p), probs, False, cum)

    def _grow(self, tree: DraftTree, open_nodes: dict[int, _Children], shape: TreeShape, level: int,
              gen: torch.Generator) -> list[int]:
        """One round of expansion; returns the new nodes. Static: b_level children under every node of the
        last level. Dynamic: the ``width`` best slots by cumulative draft log-probability of the next child."""
        if shape.budget:  # draw at once, so the node's next slot is scored with what is left after the draw
            width = min(max(1, math.isqrt(shape.budget)), shape.budget - len(tree))
            heap = [(-(c.cum + math.log(c.next_prob())), node) for node, c in open_nodes.items() if c.next_prob() > 0]
            heapq.heapify(heap)
            added = []
            while heap and len(added) < width:
                _, node = heapq.heappop(heap)
                added += self._add_child(tree, node, open_nodes[node], gen)
                left = open_nodes[node].next_prob()
                if left > 0:
                    heapq.heappush(heap, (-(open_nodes[node].cum + math.log(left)), node))
            return added
        depths = tree_depths(tree.parents)
        last = [-1] if level == 1 else [i for i in open_nodes if i >= 0 and depths[i] == level - 1]
        return [child for node in last for _ in range(shape.branching[level - 1])
                for child in self._add_child(tree, node, open_nodes[node], gen)]

    @staticmethod
    def _add_child(tree: DraftTree, node: int, children: _Children, gen: torch.Generator) -> list[int]:
        drawn = children.draw(gen)
        if drawn is None:  # the draft's support is used up
            return []
        token, row, shown = drawn
        tree.tokens.append(token)
        tree.parents.append(node)
        tree.q.append(row)
        tree.shown.append(shown)
        return [len(tree) - 1]

    def _feed(self, tree: DraftTree, nodes: list[int], prefix_len: int) -> torch.Tensor:
        """One draft pass over ``nodes`` (each sees the prefix and its ancestors); their next logits (k, V)."""
        past = self.cache.get_seq_length()
        for i, node in enumerate(nodes):
            self.slots[node] = past + i
        allowed = node_mask(tree.parents, nodes, self.slots, prefix_len, past + len(nodes))
        dtype = next(self.model.parameters()).dtype
        device = self.model.device
        depths = tree_depths(tree.parents)
        positions = torch.tensor([[prefix_len - 1 + depths[n] for n in nodes]], device=device)
        ids = torch.tensor([[tree.tokens[n] for n in nodes]], device=device)
        logits, dt = timed_forward(self.model, ids, self.cache, keep=len(nodes),
                                   attention_mask=additive_mask(allowed, dtype, device), position_ids=positions)
        tree.forward_s += dt
        tree.passes += 1
        return logits[0]

    def rollback_tree(self, prefix_len: int, path: list[int]) -> None:
        """Keep the prefix and the accepted nodes the draft has already run (a prefix of the path)."""
        kept = []
        for node in path:
            if node not in self.slots:
                break
            kept.append(self.slots[node])
        select_cache(self.cache, list(range(min(prefix_len, self.cache.get_seq_length()))) + kept)
        self.slots = {}

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()


def make_tree_drafter(models: Models, cfg: DecodeConfig) -> TreeDrafter:
    """The drafter ``cfg.drafter`` names, able to branch; ExplorerError for one that cannot, or for a target whose
    sliding-window layers the one tree mask would not limit (and whose sliding caches drop old positions)."""
    config = models.target.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if "sliding_attention" in (getattr(text, "layer_types", None) or ()) or getattr(text, "use_sliding_window", False):
        raise ExplorerError(f"the target of preset {models.preset.name!r} has sliding-window attention layers; "
                            "token trees need a target with full attention in every layer (use a chain)")
    family = family_drafter(models, cfg)
    if family is not None:  # a family's drafter branches if it says how (EAGLE's head: EAGLE-2's trees)
        if family.make_tree is None:
            raise ExplorerError(f"the {family.family} drafter of preset {models.preset.name!r} cannot branch; "
                                "trees need a draft model, the target's first layers or an EAGLE head")
        return family.make_tree(models)
    chain = make_drafter(models, cfg)
    if not isinstance(chain, ModelDrafter):
        raise ExplorerError(f"the {chain.name} drafter of preset {models.preset.name!r} cannot branch; trees "
                            "need a draft model, the target's first layers or an EAGLE head")
    return TreeDrafter(chain.model, chain.eos_id, chain.name)


def decode_speculative_tree(models: Models, prompt_ids: list[int],
                            cfg: DecodeConfig) -> Generator[Event, None, DecodeResult]:
    """Yield a Proposal (the tree) and a Verification (the path) per step; return the DecodeResult.

    Invariant (as for chains): after each step the target cache holds every kept token but the last; a step
    feeds [last, nodes...] with the tree mask and is compacted to [prefix, accepted path] afterwards.
    """
    shape = parse_tree(cfg.tree)
    assert shape is not None
    result = DecodeResult(t0=time.perf_counter())
    gen = make_generator(cfg.seed)
    eos = models.tokenizer.eos_token_id
    drafter = make_tree_drafter(models, cfg)
    target, device = models.target, models.device
    dtype = next(target.parameters()).dtype
    cache = DynamicCache()
    tokens = list(prompt_ids)
    per_depth = [[0, 0] for _ in range(shape.max_depth)]  # [a child accepted, the depth was reached] by depth
    step = 0
    while len(result.tokens) < cfg.max_new_tokens:
        remaining = cfg.max_new_tokens - len(result.tokens)
        tree = drafter.propose_tree(tokens, shape, remaining - 1, cfg, gen)
        result.draft_passes += tree.passes
        result.draft_forward_s += tree.forward_s
        yield Proposal(t=time.perf_counter(), step=step, drafter=drafter.name, gamma=max(tree.depths(), default=0),
                       tokens=tuple(tree.tokens), q=tuple(tree.shown), forward_s=tree.forward_s,
                       draft_passes=tree.passes, parents=tuple(tree.parents))
        past = cache.get_seq_length()
        fed = tokens[past:]  # the whole prompt on the first step, then [last]
        mask, positions = verify_inputs(tree.parents, past, len(fed), dtype, device)
        ids = torch.tensor([fed + tree.tokens], device=device)
        logits, dt = timed_forward(target, ids, cache, keep=len(tree) + 1, attention_mask=mask,
                                   position_ids=positions)
        p = warp_logits(logits[0], cfg.temperature, cfg.top_k, cfg.top_p)  # (n + 1, V): root, then each node
        path, checks, drawn, is_bonus = verify_tree(p, tree, gen)
        emitted = cut_emitted([tree.tokens[i] for i in path] + [drawn], eos, remaining)
        select_cache(cache, list(range(past + len(fed))) + [past + len(fed) + i for i in path])
        drafter.rollback_tree(len(tokens), path)
        observe(drafter, [tree.tokens[i] for i in path], len(path), emitted)
        tokens += emitted
        result.tokens += emitted
        result.times += [time.perf_counter() - result.t0] * len(emitted)
        result.target_passes += 1
        result.target_forward_s += dt
        result.proposed += len(tree)
        result.accepted += len(path)
        for depth in {c.position for c in checks}:  # per depth reached: was one of its children accepted?
            per_depth[depth][1] += 1
            per_depth[depth][0] += any(c.accepted for c in checks if c.position == depth)
        yield Verification(t=time.perf_counter(), step=step, checks=tuple(checks), accepted=len(path),
                           resampled=None if is_bonus else drawn, bonus=drawn if is_bonus else None,
                           emitted=tuple(emitted), forward_s=dt, target_cache_len=cache.get_seq_length(),
                           draft_cache_len=drafter.cache_len, next_gamma=cfg.gamma, path=tuple(path))
        step += 1
        if eos in emitted:
            break
    result.per_position = [(a, n) for a, n in per_depth if n]
    return result
