"""Turn a Llama-family target into a row-invariant one: every linear layer and the attention run the
kernels of ``rowinv.cpp``, whose reduction order does not depend on how many rows a pass has (nor, for a token
tree's verify pass, on which other nodes share it: a node attends to its own keys in cache order).

Why: speculative verification runs the target over gamma + 1 rows at once, autoregressive decoding one
row at a time. Greedy speculative decoding equals greedy autoregressive decoding only if row i of a k-row
pass is bit for bit the one-row pass at that position; torch's CPU kernels choose their summation order by
the number of rows (``benchmarks/row_invariance.py`` shows which), so in any precision that rounds an
argmax tie differently the outputs part. Norms, rotary embeddings and elementwise ops are computed per row
already (measured invariant); the linear layers (the LM head included) and attention are replaced here.
"""

from __future__ import annotations

import functools
import threading
import types

import torch
from torch import nn

from explorer.precision import kernels
from explorer.precision.pages import huge_page_weights
from explorer.precision.rotary import rotary_table

ATTENTION = "rowinv"  # the name registered with transformers' AttentionInterface
FORMATS = ("float32", "bfloat16", "int8")  # how the weights are stored; activations and sums are float32


class RowInvariantLinear(nn.Module):
    """Y = X W^T (no bias) through the row-invariant kernel; W in float32, bfloat16 or int8 + a scale per row."""

    def __init__(self, weight: torch.Tensor, fmt: str):
        super().__init__()
        w = weight.detach().float()
        self.fmt, self.in_features, self.out_features = fmt, w.shape[1], w.shape[0]
        scale = None
        if fmt == "int8":  # symmetric, one scale per output channel
            scale = (w.abs().amax(1) / 127.0).clamp_min(1e-12)  # (N,)
            w = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        elif fmt == "bfloat16":
            w = w.to(torch.bfloat16)
        if fmt == "int8" and kernels.use_amx():  # AMX tiles' layout: the same integer sums, faster for k rows
            w = kernels.load().pack_amx(w)
        # what the kernels read: (N, K), or AMX-packed (N/16, K/64, 16, 64); ``weight`` gives it back as (N, K)
        self.register_buffer("kernel_weight", w.contiguous(), persistent=False)
        self.register_buffer("scale", scale, persistent=False)  # (N,) or None

    @property
    def weight(self) -> torch.Tensor:
        """The stored weight as (N, K) in its storage dtype (int8 unpacked from the AMX layout)."""
        w = self.kernel_weight
        if w.dim() == 4:  # packed[b][c][r][4n + i] = W[16b + n][64c + 4r + i]
            nb, kc = w.shape[:2]
            w = w.view(nb, kc, 16, 16, 4).permute(0, 3, 1, 2, 4).reshape(nb * 16, kc * 64)
            w = w[:self.out_features, :self.in_features]
        return w

    def dequantized(self) -> torch.Tensor:
        w = self.weight.float()
        return w * self.scale[:, None] if self.scale is not None else w

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        if self.fmt == "int8":  # integer sums: each activation row rounded to 16-bit integers with its own scale
            return kernels.load().linear_a16(x.float(), self.kernel_weight, self.scale)
        return kernels.load().linear(x.float(), self.kernel_weight, self.scale)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, weights {self.fmt}, row-invariant"


def visible_keys(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """A token tree's 4-D mask (1, 1, M, L), additive (0 = seen) or bool, -> bool (M, L); None stays None (causal:
    transformers passes no mask to this attention for a plain causal pass)."""
    if attention_mask is None:
        return None
    last = getattr(_PASS, "visible", None)  # every layer of one pass gets the same mask object: convert it once
    if last is not None and last[0] is attention_mask:
        return last[1]
    if attention_mask.ndim != 4 or attention_mask.shape[:2] != (1, 1):
        raise ValueError("row-invariant attention takes a causal pass or one token tree's (1, 1, M, L) mask")
    mask = attention_mask[0, 0]
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    _PASS.visible = (attention_mask, visible)
    return visible


_PASS = threading.local()  # this thread's current target pass (lanes decode in threads side by side)


def _new_pass(module: nn.Module, args: tuple) -> None:
    """Forget the last pass's converted mask (a pre-hook on the model body: a new mask may reuse the memory)."""
    _PASS.visible = None


def row_invariant_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                            **kwargs) -> tuple[torch.Tensor, None]:
    """Attention with each query row over exactly its own keys (the transformers attention signature): causal,
    or a token tree's mask (each node over the prefix, its ancestors and itself, in cache order).

    query (1, H, M, D); key, value (1, Hkv, L, D) with the M new positions last. Returns (1, M, H, D).
    Batch 1, no padding.
    """
    if query.shape[0] != 1 or (attention_mask is not None and attention_mask.dtype == torch.bool
                               and attention_mask.ndim == 2 and not bool(attention_mask.all())):
        raise ValueError("row-invariant attention supports batch 1 without padding only")
    visible = visible_keys(attention_mask) if attention_mask is not None and attention_mask.ndim == 4 else None
    out = kernels.load().attend(query[0].float(), key[0].float(), value[0].float(), float(scaling),
                                visible)  # (M, H, D)
    return out[None], None


class FusedAttention(nn.Module):
    """Llama attention with q, k and v in one kernel call (their weight rows stacked: each output element is the
    same sum as unstacked) and the attention kernel called directly."""

    def __init__(self, attn: nn.Module, fmt: str):
        super().__init__()
        config = attn.config
        self.layer_idx, self.head_dim, self.scaling = attn.layer_idx, attn.head_dim, attn.scaling
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            if proj.bias is not None:
                raise ValueError("row-invariant linear layers take no bias")
        self.qkv = RowInvariantLinear(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), fmt)
        self.o_proj = RowInvariantLinear(attn.o_proj.weight, fmt)

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                past_key_values=None, **kwargs) -> tuple[torch.Tensor, None]:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # deferred: transformers Llama (~2 s)

        b, t, _ = hidden_states.shape
        if b != 1:
            raise ValueError("row-invariant attention supports batch 1 only")
        d = self.head_dim
        q, k, v = self.qkv(hidden_states).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], -1)
        q = q.view(b, t, self.heads, d).transpose(1, 2)  # (1, H, T, D)
        k = k.view(b, t, self.kv_heads, d).transpose(1, 2)  # (1, Hkv, T, D)
        v = v.view(b, t, self.kv_heads, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        out, _ = row_invariant_attention(self, q, k, v, kwargs.get("attention_mask"), self.scaling)  # (1, T, H, D)
        return self.o_proj(out.reshape(b, t, -1)), None


class FusedMLP(nn.Module):
    """SwiGLU with gate and up in one kernel call."""

    def __init__(self, mlp: nn.Module, fmt: str):
        super().__init__()
        if any(p.bias is not None for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
            raise ValueError("row-invariant linear layers take no bias")
        self.gate_up = RowInvariantLinear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), fmt)
        self.down_proj = RowInvariantLinear(mlp.down_proj.weight, fmt)
        self.act = mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, -1)
        return self.down_proj(self.act(gate) * up)


@functools.lru_cache(maxsize=8)
def _all_visible(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """(queries, keys) all True: a bidirectional pass's mask, made once a shape (every layer of every pass reads it;
    the kernel only reads it)."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device)


class LeanLayer(nn.Module):
    """A whole Llama decoder layer in two kernel calls, the KV cache appended between them (transformers'
    ``Cache.update``): the same arithmetic as FusedAttention + FusedMLP row by row, in far fewer Python-level ops."""

    def __init__(self, layer: nn.Module, attention: FusedAttention, mlp: FusedMLP, causal: bool = True):
        super().__init__()
        self.attention, self.mlp, self.causal = attention, mlp, causal
        self.input_norm, self.post_norm = layer.input_layernorm.weight.detach().float(), \
            layer.post_attention_layernorm.weight.detach().float()
        self.eps = float(layer.input_layernorm.variance_epsilon)
        self._args: tuple | None = None

    def _apply(self, fn, recurse=True):  # .to() and the like replace the tensors: gather them again
        self._args = None
        return super()._apply(fn, recurse)

    def _kernel_args(self) -> tuple:
        """The kernels' tensors and numbers, gathered once (module attribute lookups cost ~10% of a 2-thread pass)."""
        if self._args is None:
            a, m = self.attention, self.mlp
            self._args = (kernels.load(), a.layer_idx, float(a.scaling),
                          (self.input_norm, self.eps, a.qkv.kernel_weight, a.qkv.scale),
                          (a.heads, a.kv_heads),
                          (a.o_proj.kernel_weight, a.o_proj.scale, self.post_norm, self.eps, m.gate_up.kernel_weight,
                           m.gate_up.scale, m.down_proj.kernel_weight, m.down_proj.scale))
        return self._args

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                past_key_values=None, **kwargs) -> torch.Tensor:  # (1, M, hidden) -> (1, M, hidden)
        if hidden_states.shape[0] != 1:
            raise ValueError("row-invariant decoding supports batch 1 only")
        ext, layer, scaling, pre, heads, post = self._kernel_args()
        q, k, v = ext.pre_attention(hidden_states, *pre, *position_embeddings, *heads)  # (1, H, M, D), (1, Hkv, M, D)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, layer)
        mask = kwargs.get("attention_mask")
        if self.causal or isinstance(mask, torch.Tensor) and mask.ndim == 4:
            visible = visible_keys(mask)  # None: causal; else a tree's (M, L) mask (or a bidirectional one's)
        else:  # a bidirectional model (diffusion) with no mask: every position sees every key
            visible = _all_visible(q.shape[2], k.shape[2], q.device)
        return ext.post_attention(hidden_states, q, k, v, scaling, *post, visible)


_IGNORED = frozenset({"is_causal"})  # what a diffusion adapter passes that a LeanLayer reads from its own ``causal``


def lean_body_forward(body: nn.Module, input_ids: torch.Tensor | None = None, attention_mask=None, position_ids=None,
                      past_key_values=None, inputs_embeds=None, use_cache: bool | None = None, **kwargs):
    """The forward of a Llama body whose layers are all LeanLayers (installed by ``lean_body``): embedding, rotary,
    the layers, the final norm, and none of transformers' per-pass machinery around them (config defaults, output
    capture, mask building): 2-5% of a one-token pass (Xeon AMX, 2026-12-07). The same modules in the same
    order, so the same bits. Anything it does not state (a mask: token trees; embeddings given; a new cache; hidden
    states or attentions asked for) goes to the class's own forward; a layer with hooks (an EAGLE head reading
    features) is called as a module."""
    from transformers.modeling_outputs import BaseModelOutputWithPast  # deferred: transformers' modelling utils

    if input_ids is None or inputs_embeds is not None or attention_mask is not None or \
            (use_cache and past_key_values is None) or any(v for k, v in kwargs.items() if k not in _IGNORED):
        return type(body).forward(body, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                                  **kwargs)
    hidden = body.embed_tokens(input_ids)
    if position_ids is None:
        seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = torch.arange(seen, seen + hidden.shape[1], device=hidden.device)[None]
    rotary = body.rotary_emb(hidden, position_ids=position_ids)
    hooks = bool(nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)
    for layer in body.layers:
        if hooks or layer._forward_hooks or layer._forward_pre_hooks:
            hidden = layer(hidden, position_embeddings=rotary, past_key_values=past_key_values)
        else:
            hidden = layer.forward(hidden, rotary, past_key_values)
    return BaseModelOutputWithPast(last_hidden_state=body.norm(hidden), past_key_values=past_key_values)


def lean_body(body: nn.Module) -> None:
    """Route ``body``'s (a transformers LlamaModel of LeanLayers) forward through ``lean_body_forward``; a bound
    method, so a deep copy of the model binds its own body."""
    if all(isinstance(layer, LeanLayer) for layer in body.layers) and \
            type(body).__module__.startswith("transformers.models.llama"):
        body.forward = types.MethodType(lean_body_forward, body)


def register_attention() -> None:
    from transformers import AttentionInterface  # deferred: transformers modelling utils (~2 s to import)

    AttentionInterface.register(ATTENTION, row_invariant_attention)


def make_row_invariant(model: nn.Module, fmt: str, lean: bool = True) -> nn.Module:
    """Replace, in place, every linear layer of a causal Llama-family model (its decoder layers and LM head)
    with a RowInvariantLinear in ``fmt``, and route its attention through ``row_invariant_attention``; with
    ``lean`` each decoder layer becomes a LeanLayer (two kernel calls)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}")
    if not hasattr(model, "model") or not hasattr(model.model, "layers"):
        raise ValueError("row-invariant decoding needs a Llama-family model (model.layers)")
    if any(getattr(layer.self_attn, "is_causal", True) is False for layer in model.model.layers):
        raise ValueError("row-invariant attention is causal; this model is bidirectional")
    kernels.load()
    register_attention()
    lean = lean and getattr(model.config, "hidden_act", "silu") == "silu"  # LeanLayer's MLP is SwiGLU
    for i, layer in enumerate(model.model.layers):
        layer.self_attn = FusedAttention(layer.self_attn, fmt)
        layer.mlp = FusedMLP(layer.mlp, fmt)
        if lean:
            model.model.layers[i] = LeanLayer(layer, layer.self_attn, layer.mlp)
    if lean:
        lean_body(model.model)
    rotary_table(model.model)  # lean or not: a pass's rotary bits must not depend on the threads
    head = model.get_output_embeddings()
    model.model.register_forward_pre_hook(_new_pass)
    model.lm_head = RowInvariantLinear(head.weight, fmt)  # untied: the input embedding stays float32
    model.config.tie_word_embeddings = False
    model.config._attn_implementation = ATTENTION
    for module in model.modules():
        if hasattr(module, "config") and module.config is not model.config:
            module.config._attn_implementation = ATTENTION
    _huge_page_model(model)
    return model


def _huge_page_model(model: nn.Module, extra: tuple = ()) -> None:
    huge_page_weights([*(m for m in model.modules() if isinstance(m, RowInvariantLinear)), *extra])
    for module in model.modules():
        if isinstance(module, LeanLayer):
            module._args = None  # gathered again from the moved weights


def use_kernels_in_eagle_head(head: nn.Module, fmt: str) -> nn.Module:
    """An EAGLE head (families/eagle/head.py) with its input projection, layer and kept LM-head rows on the kernels."""
    head.fc = RowInvariantLinear(head.fc.weight, fmt)
    if getattr(head, "fuse_layers", ()):  # EAGLE-3's fused features
        head.fuse = RowInvariantLinear(head.fuse.weight, fmt)
    layer = head.layer
    # q, k, v (and gate, up) as one kernel call each: weights are stored a row at a time (int8: one scale per row)
    # and every output column is its own fixed sum, so the stacked rows give the separate layers' bits
    qkv = [layer._modules.pop(name).weight for name in ("q_proj", "k_proj", "v_proj")]
    gate_up = [layer._modules.pop(name).weight for name in ("gate_proj", "up_proj")]
    layer.qkv_proj = RowInvariantLinear(torch.cat(qkv), fmt)
    layer.gate_up_proj = RowInvariantLinear(torch.cat(gate_up), fmt)
    layer.o_proj = RowInvariantLinear(layer.o_proj.weight, fmt)
    layer.down_proj = RowInvariantLinear(layer.down_proj.weight, fmt)
    head.shared["head_linear"] = RowInvariantLinear(head.shared["head"], fmt)
    head.lean = LeanEagleLayer(layer)
    _huge_page_model(head, [head.shared["head_linear"]])
    return head


class LeanEagleLayer:
    """An EAGLE head's layer in the target's two kernel calls (``pre_attention``, ``post_attention``): norm, q|k|v,
    rotary; attention over the head's cache (causal, or a token tree's visible keys), o_proj, MLP: no torch ops
    around the same kernels (a step in a hot loop 366 instead of 596 us). A draft need not be row-invariant, only the
    target's verify pass: the features are those of the torch step to float rounding (tests/test_eagle_tree.py).
    A plain object holding the layer, so a deep copy of the head holds its own copy's."""

    def __init__(self, layer: nn.Module):
        self.layer = layer

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: list[torch.Tensor] | None,
                 mask: torch.Tensor | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        a, ext = self.layer, kernels.load()
        pre, post = a.input_layernorm, a.post_attention_layernorm
        q, k, v = ext.pre_attention(x.float(), pre.weight, pre.eps, a.qkv_proj.kernel_weight, a.qkv_proj.scale,
                                    cos.float(), sin.float(), a.heads, a.kv_heads)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        out = ext.post_attention(x.float(), q, k, v, a.head_dim ** -0.5, a.o_proj.kernel_weight, a.o_proj.scale,
                                 post.weight, post.eps, a.gate_up_proj.kernel_weight, a.gate_up_proj.scale,
                                 a.down_proj.kernel_weight, a.down_proj.scale, mask)
        return out, [k, v]


def use_kernels_in_diffusion(model: nn.Module, fmt: str) -> nn.Module:
    """A transformers diffusion model (the bidirectional copy of the target that a diffusion adapter makes) with
    every linear layer, its LM head included, on the kernels in ``fmt``: the target's weight format, so the page
    times both paradigms at one precision. A transformers Llama with SwiGLU runs each layer as a LeanLayer that sees
    every key (bidirectional: two kernel calls a layer, as the target); any other model keeps torch's attention in
    float32 with its linear layers on the kernels. Nothing here needs row invariance, only the speed of the format.
    The input embedding stays float32."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}")
    linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    if not linears or any(child.bias is not None for _, _, child in linears):
        raise ValueError("the diffusion model's linear layers must be bias-free (Llama family)")
    kernels.load()
    model.float()
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is not None and type(model).__module__.startswith("transformers.models.llama") and \
            getattr(model.config, "hidden_act", "silu") == "silu":  # each layer in two kernel calls, as the target's
        for i, layer in enumerate(layers):
            layers[i] = LeanLayer(layer, FusedAttention(layer.self_attn, fmt), FusedMLP(layer.mlp, fmt), causal=False)
        lean_body(model.model)
        rotary_table(model.model)
        model.model.register_forward_pre_hook(_new_pass)
        linears = [(model, "lm_head", model.lm_head)]
    for parent, name, child in linears:
        setattr(parent, name, RowInvariantLinear(child.weight, fmt))
    model.config.tie_word_embeddings = False
    model.kernel_format = fmt
    _huge_page_model(model)
    return model


def is_row_invariant(model: nn.Module) -> bool:
    return isinstance(getattr(model, "lm_head", None), RowInvariantLinear)
