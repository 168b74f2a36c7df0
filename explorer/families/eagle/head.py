"""A feature-level draft head (EAGLE, Li et al. 2024) for a Llama-family target, and its drafter.

The head drafts from what the target has already computed. At position i it reads the target's
final hidden state f_i (after the final norm: the vector the target's LM head reads) and the
embedding of the next token x_{i+1}, and predicts f_{i+1} with one decoder layer of its own. The
target's LM head, frozen and cut to the kept tokens (FR-Spec), turns that predicted feature into the
distribution of x_{i+2} (the layer's output is the predicted feature itself: no final norm). To
draft gamma tokens the head runs on its own predictions: the next step reads [embedding(drafted
token), predicted feature]. Only the input projection and the layer are the head's own (4.2 M
parameters for SmolLM2-135M); the embedding and LM head rows are the target's, shared, not stored.

Outside the kept tokens the head's logits are -inf, so q = 0 there: a token it cannot propose is
never proposed, and after a rejection the residual norm(max(0, p - q)) gives those tokens exactly
their target probability, so speculative sampling stays exact.

``forward_depths`` is the training-time forward (the "training-time test" of EAGLE-3): depth d
predicts every position as the d-th drafting step would, attending to true inputs up to where its
chain started and to the chain's own earlier (predicted) inputs after it.

EAGLE-3's fused features (``fuse_layers`` in the config): the first drafting step reads, in place of f_i, a
learned mix of f_i and the outputs of lower decoder layers at position i (each RMS-normed), captured from the
same verify pass; later steps read the head's own predicted features as before. A fused head starts as the plain
one (the mix begins as f_i alone: ``build_eagle_head``).

Its files and its start from the target: ``files.py``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from explorer.decoding.config import DecodeConfig
from explorer.decoding.draft import Draft
from explorer.decoding.sampling import sample, warp_logits
from explorer.errors import ExplorerError
from explorer.runtime import synchronize


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))  # cpu: module init; moved with the module
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (T, head_dim), Llama's half-split layout."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[:, None] * inv[None]  # (T, head_dim / 2)
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class HeadLayer(nn.Module):
    """One Llama decoder layer (pre-norm attention with GQA and RoPE, SwiGLU MLP), written out so the
    training forward can mix true and predicted keys (``forward_depths``)."""

    def __init__(self, config):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.gate_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, h, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x: (B, T, H) -> q (B, heads, T, d), k and v (B, heads, T, d) (kv heads repeated)."""
        b, t, _ = x.shape
        n = self.input_layernorm(x)
        if "qkv_proj" in self._modules:  # q, k and v rows in one kernel call (precision/exact.py: the same bits)
            q, k, v = self.qkv_proj(n).split([self.heads * self.head_dim] + [self.kv_heads * self.head_dim] * 2, -1)
        else:
            q, k, v = self.q_proj(n), self.k_proj(n), self.v_proj(n)
        q = q.reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        rep = self.heads // self.kv_heads
        return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual, output projection and the MLP. attended: (B, heads, T, d)."""
        b, _, t, _ = attended.shape
        x = x + self.o_proj(attended.transpose(1, 2).reshape(b, t, -1))
        n = self.post_attention_layernorm(x)
        if "gate_up_proj" in self._modules:  # as qkv_proj
            gate, up = self.gate_up_proj(n).chunk(2, -1)
            return x + self.down_proj(F.silu(gate) * up)
        return x + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))


class EagleHead(nn.Module):
    def __init__(self, config, kept_ids: torch.Tensor):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        # EAGLE-3's fused features: the outputs of two lower decoder layers beside the final feature, each
        # lower one normed, mixed into one H vector that the first drafting step reads in place of f_i
        self.fuse_layers = tuple(getattr(config, "fuse_layers", None) or ())
        if self.fuse_layers:
            self.fuse_norms = nn.ModuleList(RMSNorm(h, config.rms_norm_eps) for _ in self.fuse_layers)
            self.fuse = nn.Linear((len(self.fuse_layers) + 1) * h, h, bias=False)
        self.layer = HeadLayer(config)
        self.register_buffer("kept_ids", kept_ids.to(torch.long), persistent=True)  # (K,) target token ids
        self.shared: dict[str, torch.Tensor] = {}  # the target's embedding and kept LM-head rows (not stored)
        # (x, cos, sin, cache, mask) -> (features, cache): the layer as a whole, set by an exact precision's kernels
        self.lean: Callable | None = None
        params = getattr(config, "rope_parameters", None) or {}
        self.theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))

    def attach(self, target: nn.Module) -> EagleHead:
        """Share the target's embedding and the kept rows of its LM head (a copy of K rows)."""
        emb = target.get_input_embeddings().weight
        head = target.get_output_embeddings().weight
        self.shared = {"embed": emb, "head": head[self.kept_ids.to(head.device)].detach().clone()}
        return self

    @property
    def device(self) -> torch.device:
        return self.kept_ids.device  # a buffer every head has (fc's weight may be a packed kernel buffer)

    @property
    def full_vocab_size(self) -> int:
        return int(self.config.vocab_size)

    def head_bytes(self) -> int:
        """Memory the head adds beside the target: its weights and the kept LM-head rows it copies."""
        return sum(t.numel() * t.element_size() for t in [*self.state_dict().values(), self.shared["head"]])

    @property
    def feature_size(self) -> int:
        """Width of the true features the head reads: H, or (fused layers + 1) * H with EAGLE-3's fusion."""
        return (len(self.fuse_layers) + 1) * self.config.hidden_size

    def fused(self, feats: torch.Tensor) -> torch.Tensor:
        """True features (…, feature_size) -> (…, H): [lower layers' outputs ; f_i] mixed (identity without
        fusion). Later drafting steps read the head's own predicted features (H) instead."""
        if not self.fuse_layers:
            return feats
        h = self.config.hidden_size
        parts = [norm(feats[..., j * h:(j + 1) * h]) for j, norm in enumerate(self.fuse_norms)]
        return self.fuse(torch.cat([*parts, feats[..., -h:]], -1))

    def inputs(self, next_ids: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """[embedding(x_{i+1}) ; f_i] -> the layer's input. next_ids (B, T), feats (B, T, H)."""
        emb = F.embedding(next_ids, self.shared["embed"]).to(feats.dtype)
        return self.fc(torch.cat([emb, feats], -1))

    def kept_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """Logits over the kept tokens of a predicted feature (…, H) -> (…, K)."""
        if "head_linear" in self.shared:  # an exact precision put the kept rows on its kernels (explorer/precision)
            return self.shared["head_linear"](predicted)
        return predicted @ self.shared["head"].T.to(predicted.dtype)

    def full_logits(self, predicted: torch.Tensor, small: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the whole vocabulary (-inf outside the kept tokens); ``small``: the kept ones, if computed."""
        small = self.kept_logits(predicted) if small is None else small
        full = small.new_full((*small.shape[:-1], self.full_vocab_size), float("-inf"))
        full[..., self.kept_ids] = small
        return full

    # ------------------------------------------------------------------ inference (a plain KV cache)
    def step(self, next_ids: torch.Tensor, feats: torch.Tensor, start: int, cache: list[torch.Tensor] | None,
             positions: list[int] | None = None, mask: torch.Tensor | None = None):
        """Run positions start .. start+T-1 (batch 1) after ``cache`` ([k, v] of the entries before them).

        A token tree's nodes (``tree.py``) give their own ``positions`` (root + depth) and ``mask`` (bool (T, cache
        + T): each node sees the true positions and its ancestors). Returns the predicted features (1, T, H) and
        the cache extended by these entries (with ``lean`` set, k and v keep the layer's kv heads, unrepeated).
        """
        x = self.inputs(next_ids, feats)
        t = x.shape[1]
        cos, sin = self._rope(list(positions) if positions is not None else range(start, start + t), x)
        if self.lean is not None:  # the layer on the kernels in two calls (precision/exact.py: LeanEagleLayer)
            return self.lean(x, cos, sin, cache, mask)
        q, k, v = self.layer.qkv(x, cos, sin)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        if mask is None and t > 1:  # one query row sees every cached key: no mask
            mask = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device).tril(k.shape[2] - t)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.layer.finish(x, attended), [k, v]

    def _rope(self, positions, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (T, head_dim) at these positions, read from a table grown by doubling (elementwise: the bits
        ``rope_tables`` gives for the positions alone)."""
        top = max(positions) + 1
        table = getattr(self, "_rope_table", None)
        if table is None or table[0].shape[0] < top or table[0].device != x.device or table[0].dtype != x.dtype:
            size = max(256, 1 << (top - 1).bit_length())
            cos, sin = rope_tables(torch.arange(size, device=x.device), self.layer.head_dim, self.theta)
            table = self._rope_table = (cos.to(x.dtype), sin.to(x.dtype))
        if isinstance(positions, range):
            return table[0][positions.start:positions.stop], table[1][positions.start:positions.stop]
        at = torch.tensor(positions, device=x.device)
        return table[0][at], table[1][at]

    # ------------------------------------------------------------------ training (EAGLE-3's test)
    def forward_depths(self, next_ids: torch.Tensor, feats: torch.Tensor, depths: int) -> list[torch.Tensor]:
        """Predicted features of drafting steps 1 .. ``depths`` at every position, teacher-forced.

        next_ids (B, T): x_{i+1}; feats (B, T, feature_size): the target's f_i (after the fused layers' outputs,
        if any). Returns a list whose d-th entry (B, T, H) at position i is the feature step d+1 of a chain
        begun at position i - d predicts for position i + 1. Step d's query at i attends to true keys at
        positions <= i - d and to the chain's own keys at i - d + 1 .. i (its inputs at depth 1 .. d along the
        diagonal).
        Positions i < d are meaningless at depth d (no chain start): mask them out of the loss.
        """
        b, t, _ = feats.shape
        cos, sin = rope_tables(torch.arange(t, device=feats.device), self.layer.head_dim, self.theta)
        cos, sin = cos.to(feats.dtype), sin.to(feats.dtype)
        scale = 1.0 / math.sqrt(self.layer.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool, device=feats.device).tril()
        keys, values, outs = [], [], []
        first = self.fused(feats)
        x = self.inputs(next_ids, first)
        for d in range(depths):
            if d:  # depth d reads the previous depth's prediction for its own position
                previous = torch.cat([first[:, :1], outs[-1][:, :-1]], 1)
                x = self.inputs(next_ids, previous)
            q, k, v = self.layer.qkv(x, cos, sin)
            keys.append(k)
            values.append(v)
            # true keys (depth 0) at j <= i - d
            main = (q @ keys[0].transpose(-1, -2)) * scale  # (B, h, T, T)
            main = main.masked_fill(~causal.tril(-d), float("-inf"))
            diag, diag_v = [], []
            for e in range(1, d + 1):  # the chain's key of depth e sits at position i - d + e
                shift = d - e
                k_e = F.pad(keys[e], (0, 0, shift, 0))[:, :, :t]  # k_e[i] = keys[e][i - shift]
                v_e = F.pad(values[e], (0, 0, shift, 0))[:, :, :t]
                diag.append((q * k_e).sum(-1, keepdim=True) * scale)
                diag_v.append(v_e)
            scores = torch.cat([main, *diag], -1).softmax(-1)
            attended = scores[..., :t] @ values[0]
            for j, v_e in enumerate(diag_v):
                attended = attended + scores[..., t + j:t + j + 1] * v_e
            outs.append(self.layer.finish(x, attended))
        return outs


def is_eagle(model: Any) -> bool:
    return isinstance(model, EagleHead)


# ----------------------------------------------------------------------------------------------
# the drafter

@dataclass
class FeatureDrafter:
    """Drafts with an EagleHead from the target's features, captured from each verify pass.

    A one-shot hook on the target's body, armed in ``propose``, keeps the final hidden states of the
    next target pass (the verify pass; the first is the prefill, so the first proposal drafts
    nothing). Positions whose token was accepted keep their features; the head's own KV cache holds
    only positions with true features and is cut back after each proposal.
    """

    drafts_after_prefill: ClassVar[bool] = True  # the prefill makes the first features: nothing to draft before

    target: nn.Module
    head: EagleHead
    eos_id: int | None
    name: str = "eagle"
    feats: torch.Tensor | None = None  # (L, H) true features of positions 0 .. known-1
    known: int = 0
    captured: tuple[int, torch.Tensor] | None = None  # (first fed position, (T, H)) of the last pass
    cache: list[torch.Tensor] | None = None  # the head's [k, v] for positions < cached
    cached: int = 0
    hooks: list = field(default_factory=list)

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, gen: torch.Generator):
        self._absorb(len(tokens) - 1)  # features of every position but the last token's
        self._arm()
        if self.known == 0 or gamma < 1:
            return Draft([], None)
        device = self.head.device
        synchronize(device)
        start = time.perf_counter()
        drafted, rows = [], []
        with torch.inference_mode():
            ids = torch.tensor([tokens[self.cached + 1:self.known + 1]], device=device)
            true = self.head.fused(self.feats[None, self.cached:self.known])
            out, cache = self.head.step(ids, true, self.cached, self.cache)
            self.cache, self.cached = cache, self.known  # true positions only: kept
            predicted, position, sure = out[:, -1:], self.known, 1.0
            for i in range(gamma):
                small = self.head.kept_logits(predicted[0, -1]).float()
                logits = self.head.full_logits(None, small)
                q = warp_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)
                token = sample(q, gen)
                drafted.append(token)
                rows.append(q)
                if cfg.draft_confidence is not None:  # stop where the draft's value (EAGLE-2) falls below it
                    sure *= math.exp(float(logits[token] - torch.logsumexp(small, -1)))  # the kept tokens' softmax
                if token == self.eos_id or i == gamma - 1 or sure < (cfg.draft_confidence or 0.0):
                    break
                predicted, cache = self.head.step(torch.tensor([[token]], device=device), predicted, position, cache)
                position += 1
        synchronize(device)
        return Draft(drafted, torch.stack(rows), time.perf_counter() - start, len(drafted))

    def _absorb(self, known: int) -> None:
        """Keep the captured features of positions < ``known`` (the verified ones)."""
        if self.captured is not None:
            first, hidden = self.captured
            self.captured = None
            n = known - first
            if n > 0 and hidden is not None:
                if self.feats is None or self.feats.shape[0] < known:
                    grown = hidden.new_zeros(max(known * 2, 256), hidden.shape[-1])
                    if self.feats is not None:
                        grown[:self.known] = self.feats[:self.known]
                    self.feats = grown
                self.feats[first:known] = hidden[:n]
                self.known = known
        if self.cached >= self.known and self.cache is not None:  # the head re-runs at least the last position
            self.cached = max(0, self.known - 1)
            self.cache = [c[:, :, :self.cached] for c in self.cache]

    def _arm(self) -> None:
        """Capture the next target pass made by this thread (the verify pass). Another thread's decode on the same
        target (the app's lanes, decoded side by side) must not fill or disarm it."""
        self._disarm()
        body, owner = self.target.model, threading.get_ident()
        lower: dict[int, torch.Tensor] = {}  # the fused layers' outputs of this pass (EAGLE-3)

        def pre(module, args, kwargs):
            if threading.get_ident() == owner:
                cache = kwargs.get("past_key_values")
                self.captured = (cache.get_seq_length() if cache is not None else 0, None)

        def keep(index: int):
            def hook(module, args, output):
                if threading.get_ident() == owner:
                    lower[index] = (output[0] if isinstance(output, tuple) else output)[0].detach()
            return hook

        def post(module, args, kwargs, output):
            if threading.get_ident() == owner:
                last = output.last_hidden_state[0].detach()
                parts = [lower[i].to(last.dtype) for i in self.head.fuse_layers]
                self.captured = (self.captured[0], torch.cat([*parts, last], -1) if parts else last)
                self._disarm()

        self.hooks = [body.register_forward_pre_hook(pre, with_kwargs=True),
                      *(body.layers[i].register_forward_hook(keep(i)) for i in self.head.fuse_layers),
                      body.register_forward_hook(post, with_kwargs=True)]

    def _disarm(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []

    def rollback(self, keep: int) -> None:
        pass  # features past the accepted tokens are dropped in the next proposal (``_absorb``)

    @property
    def cache_len(self) -> int:
        return self.cached


def make_feature_drafter(models) -> FeatureDrafter:
    if not hasattr(models.target, "model") or not hasattr(models.target.model, "layers"):
        raise ExplorerError("the EAGLE head needs a Llama-family target (model.layers)")
    return FeatureDrafter(models.target, models.assistant, models.tokenizer.eos_token_id)
