"""Token trees: the flattened tree's attention mask and positions, exact acceptance over siblings, and KV
cache compaction to the accepted path.

A tree is a list of nodes in parent-before-child order; ``parents[i]`` is node i's parent, -1 for the root
(the last verified token). Flattened after the verified prefix, node i sits at sequence position
``root + depth(i)`` and attends to the prefix, its ancestors and itself only (SpecInfer, Miao et al. 2023,
Sec. 4 "tree-based parallel decoding"; the same mask as Medusa and EAGLE-2).

Acceptance at T > 0 is recursive rejection sampling over the children of a node, tried in order (SpecInfer's
multi-step speculative sampling, Miao et al. 2023, Alg. 2; SpecTr, Sun et al. 2023): child x_j is accepted
with probability min(1, p_j(x_j) / q_j(x_j)); after a rejection the target distribution becomes the residual
p_{j+1} = norm(max(0, p_j - q_j)); when no child is accepted the token is drawn from the last residual. The
children are drawn from the draft *without replacement* (no duplicate branches), so q_j is the draft's
distribution with the earlier siblings removed and renormalized: this is Recursive Rejection Sampling
(Jeon et al. 2024, "Recursive Speculative Decoding", Sec. 3.2, Thm. 3.1), exact for any number of children.
Why it holds: given the siblings drawn so far, stage j emits y with probability min(p_j, q_j)(y) and
otherwise hands over to p_{j+1}, which does not depend on the rejected x_j, so by induction each stage emits
exactly p_j and the node emits p. An accepted child recurses with the target's distribution at that child;
a reached leaf draws the bonus token from it. At T = 0 every distribution is one-hot and the rule reduces to
"follow the child equal to the target's argmax as far as it goes".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from explorer.decoding.acceptance import acceptance_probability, residual_distribution  # one rule for chains too
from explorer.decoding.events import DraftCheck
from explorer.decoding.sampling import sample, uniform


@dataclass
class DraftTree:
    """Drafted nodes: token, parent, and the distribution each was drawn from (as ``Draft.q`` for a chain)."""

    tokens: list[int] = field(default_factory=list)  # (n,)
    parents: list[int] = field(default_factory=list)  # (n,) parent index, -1 = the root
    q: list[torch.Tensor] = field(default_factory=list)  # n rows (V,): what node i was drawn from
    shown: list[float] = field(default_factory=list)  # (n,) the draft's probability of each token, for display
    forward_s: float = 0.0
    passes: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1 = the root) in the order verification tries them."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def depths(self) -> list[int]:
        return tree_depths(self.parents)


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of each node: 1 for a child of the root."""
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


def ancestors_and_self(parents: list[int], node: int) -> list[int]:
    chain = []
    while node >= 0:
        chain.append(node)
        node = parents[node]
    return chain


def node_mask(parents: list[int], nodes: list[int], slot: dict[int, int], prefix_len: int,
              kv_len: int) -> torch.Tensor:
    """bool (len(nodes), kv_len): row r lets ``nodes[r]`` see the prefix [0, prefix_len) and the cache slots of
    its ancestors and itself (``slot``: node -> its column)."""
    allowed = torch.zeros(len(nodes), kv_len, dtype=torch.bool, device="cpu")  # built here, moved by additive_mask
    allowed[:, :prefix_len] = True
    for r, node in enumerate(nodes):
        allowed[r, [slot[a] for a in ancestors_and_self(parents, node)]] = True
    return allowed


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """bool (Q, K) -> the additive float mask (1, 1, Q, K) a transformers model takes as is: 0 or dtype min."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device="cpu")
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def verify_inputs(parents: list[int], past: int, fed: int, dtype: torch.dtype,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's verify pass over [fed prefix tokens, n nodes] after ``past`` cached positions.

    Returns the mask (1, 1, fed + n, past + fed + n) and position ids (1, fed + n): the prefix rows are
    causal, node i sits at position past + fed - 1 + depth(i) and sees the prefix, its ancestors and itself.
    """
    n, prefix_len = len(parents), past + fed
    kv_len = prefix_len + n
    causal = torch.ones(fed, kv_len, dtype=torch.bool, device="cpu").tril(past)  # row i sees columns <= past + i
    causal[:, prefix_len:] = False
    slot = {i: prefix_len + i for i in range(n)}
    allowed = torch.cat([causal, node_mask(parents, list(range(n)), slot, prefix_len, kv_len)])  # (fed + n, kv)
    positions = list(range(past, prefix_len)) + [prefix_len - 1 + d for d in tree_depths(parents)]
    return additive_mask(allowed, dtype, device), torch.tensor([positions], device=device)


def verify_tree(p: torch.Tensor, tree: DraftTree,
                gen: torch.Generator) -> tuple[list[int], list[DraftCheck], int, bool]:
    """p: (n + 1, V) warped target distributions, row 0 at the root, row 1 + i at node i.

    Returns (accepted path of node indices, the checks made, the target-drawn token, whether it is a bonus).
    """
    path, checks, node = [], [], -1
    depth = 0
    while True:
        target = p[node + 1]  # the target's distribution after the path so far
        kids = tree.children(node)
        for child in kids:
            token, q = tree.tokens[child], tree.q[child]
            p_x, q_x = float(target[token]), float(q[token])
            ratio = acceptance_probability(p_x, q_x)
            accepted = ratio >= 1.0 or (ratio > 0.0 and uniform(gen) < ratio)
            checks.append(DraftCheck(position=depth, token=token, p=p_x, q=q_x, accept_prob=ratio,
                                     accepted=accepted, node=child))
            if accepted:
                break
            target = residual_distribution(target, q)  # the next sibling competes for what is left
        else:  # no child accepted (or a leaf): draw from the last residual (a leaf: the target's own p)
            return path, checks, sample(target, gen), not kids
        path.append(child)
        node, depth = child, depth + 1


def select_cache(cache, keep: list[int]) -> None:
    """Keep only the sequence positions ``keep`` (in that order) of every layer of a DynamicCache."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        index = torch.tensor(keep, device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)  # (B, heads, S, d) -> (B, heads, len(keep), d)
        layer.values = layer.values.index_select(-2, index)


def kv_bytes(cache) -> int:
    """Bytes a DynamicCache holds (keys and values of every layer)."""
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None:
                total += t.numel() * t.element_size()
    return total
