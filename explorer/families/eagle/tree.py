"""EAGLE's head drafting a token tree (EAGLE-2, Li et al. 2024): the tree decoder's growth rule
(``decoding/speculative_tree.TreeDrafter``) with the head in place of a draft model.

The root's distribution comes from the head run on the target's true features of the positions verified
since the last proposal (as the chain drafter, ``head.FeatureDrafter``). A node at depth d reads
[embedding(its token), its parent's predicted feature] at position root + d - 1 and attends to the head's
cache of true positions and to its own ancestors only (the tree mask), so one head pass expands a whole
level. The nodes' keys live in a copy of the head's cache for this proposal only; the true positions stay.

The target's verify pass runs over [fed tokens, every node]; its features (captured by the chain drafter's
hook) are cut to the fed rows and the accepted path's rows before the next proposal absorbs them, so the
head always reads the features of the tokens that were kept, at the positions they were kept at.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from explorer.decoding.speculative_tree import TreeDrafter
from explorer.decoding.tree import DraftTree, node_mask, tree_depths
from explorer.families.eagle.head import FeatureDrafter, make_feature_drafter
from explorer.runtime import synchronize


@dataclass
class EagleTreeDrafter(TreeDrafter):
    feature: FeatureDrafter | None = None  # the chain drafter: true features, the head's cache, the capture hook
    node_cache: list[torch.Tensor] | None = None  # the head's [k, v]: true positions, then this tree's nodes
    predicted: dict[int, torch.Tensor] = field(default_factory=dict)  # node (-1: the root) -> its feature (1, 1, H)
    armed: bool = False  # this proposal armed the capture of the coming verify pass

    def _root(self, tokens: list[int], tree: DraftTree) -> torch.Tensor | None:
        fd, head = self.feature, self.feature.head
        fd._absorb(len(tokens) - 1)  # the features of every kept position but the last token's
        fd._arm()  # capture the coming verify pass
        self.armed = True
        if fd.known == 0:
            return None
        synchronize(head.device)
        start = time.perf_counter()
        with torch.inference_mode():
            ids = torch.tensor([tokens[fd.cached + 1:fd.known + 1]], device=head.device)
            true = head.fused(fd.feats[None, fd.cached:fd.known])
            out, cache = head.step(ids, true, fd.cached, fd.cache)
            fd.cache, fd.cached = cache, fd.known  # true positions only: kept across proposals
            self.node_cache, self.predicted = cache, {-1: out[:, -1:]}
            logits = head.full_logits(out[0, -1])
        synchronize(head.device)
        tree.forward_s, tree.passes = time.perf_counter() - start, 1
        return logits

    def _feed(self, tree: DraftTree, nodes: list[int], prefix_len: int) -> torch.Tensor:
        fd, head = self.feature, self.feature.head
        synchronize(head.device)
        start = time.perf_counter()
        past = self.node_cache[0].shape[2]
        for i, node in enumerate(nodes):
            self.slots[node] = past + i
        allowed = node_mask(tree.parents, nodes, self.slots, fd.cached, past + len(nodes)).to(head.device)
        depths = tree_depths(tree.parents)
        with torch.inference_mode():
            ids = torch.tensor([[tree.tokens[n] for n in nodes]], device=head.device)
            parents = torch.cat([self.predicted[tree.parents[n]] for n in nodes], 1)  # (1, k, H)
            out, self.node_cache = head.step(ids, parents, fd.cached, self.node_cache,
                                             positions=[fd.cached + depths[n] - 1 for n in nodes], mask=allowed)
            for i, node in enumerate(nodes):
                self.predicted[node] = out[:, i:i + 1]
            logits = head.full_logits(out[0])
        synchronize(head.device)
        tree.forward_s += time.perf_counter() - start
        tree.passes += 1
        return logits

    def rollback_tree(self, prefix_len: int, path: list[int]) -> None:
        """Keep the verify pass's features of the fed tokens and of the accepted path (in path order)."""
        fd = self.feature
        if self.armed and fd.captured is not None and fd.captured[1] is not None:
            first, hidden = fd.captured
            fed = prefix_len - first
            rows = list(range(fed)) + [fed + i for i in path]
            fd.captured = (first, hidden[torch.tensor(rows, device=hidden.device)])
        self.slots, self.node_cache, self.predicted, self.armed = {}, None, {}, False

    @property
    def cache_len(self) -> int:
        return self.feature.cached


def make_eagle_tree_drafter(models) -> EagleTreeDrafter:
    chain = make_feature_drafter(models)
    return EagleTreeDrafter(model=chain.head, eos_id=chain.eos_id, name=chain.name, feature=chain)
