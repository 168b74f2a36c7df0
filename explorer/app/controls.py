"""The sidebar's decoding controls, in ``lane_settings.Settings`` field order, and the diffusion plan line."""

from __future__ import annotations

from typing import Any

import gradio as gr

from explorer.app import hosting
from explorer.app.lane_settings import BLOCKS, FLAG_FIELDS, TOKENS_PER_STEP, diffusion_plan, preset_settings
from explorer.decoding.config import CACHES, DRAFTERS, METHODS, REMASKING
from explorer.decoding.unmasking import DEFAULT_ENTROPY_BOUND, DEFAULT_REVOKE_BELOW, SAMPLERS


def build_settings(c: Any, default_preset: str, speeds: list[tuple[str, str]], live: str) -> list[Any]:
    """The sidebar: preset, lanes and every decoding control; returns the Settings components."""
    d = preset_settings(default_preset)
    choices, hidden_note = hosting.preset_choices()  # GPU presets only where CUDA is; random-gemma4 nowhere
    c.preset = gr.Dropdown(choices, value=default_preset, label="Preset", info=hidden_note)
    c.lanes = gr.CheckboxGroup(list(METHODS), value=list(METHODS), label="Lanes", elem_id="lane-choice",
                               info="autoregressive = the reference every speedup is measured against")
    c.speed = gr.Dropdown(speeds, value=live, label="Playback", elem_id="speed",
                          info="live is fastest; 'timed' decodes each lane alone, so its clock is honest, then "
                               "replays all of them on one clock at the pace chosen")
    gr.Markdown("**All lanes**")
    max_new = gr.Slider(8, 256, value=d.max_new_tokens, step=8, label="max new tokens (N)", elem_id="max-new")
    temperature = gr.Slider(0, 2, value=d.temperature, step=0.05, label="temperature (0 = greedy)",
                            elem_id="temperature")
    top_p = gr.Slider(0.05, 1, value=d.top_p, step=0.05, label="top-p (1 = off)")
    seed = gr.Number(d.seed, precision=0, label="seed")
    gr.Markdown("**Speculative**")
    drafter = gr.Radio(list(DRAFTERS), value=d.drafter, label="drafter")
    gamma = gr.Slider(1, 16, value=d.gamma, step=1, label="γ (drafts per step, at most)", elem_id="gamma")
    adaptive = gr.Checkbox(d.adaptive_gamma, label="adaptive γ (+2 after a full acceptance, −1 after a rejection)")
    tree = gr.Textbox(d.tree, label="token tree (empty: a chain of γ)", placeholder="3,2,1 or dynamic:16",
                      info="branching per depth, or EAGLE-2's dynamic tree of N nodes; drafters model, early_exit and "
                           "assistant (an EAGLE head), every precision", elem_id="tree")
    confidence = gr.Slider(0, 0.95, value=d.draft_confidence, step=0.05, label="stop the draft below this "
                           "probability (0 = always γ)", elem_id="draft-confidence",
                           info="a chain's draft ends once the drafter's probability of all of it falls below this "
                                "(EAGLE-2's value of a draft); γ is then the longest draft")
    gr.Markdown("**Diffusion** (K and the block length follow N)")
    per_step = gr.Radio([(f"N/{r}" if r > 1 else "N (one token a pass)", r) for r in TOKENS_PER_STEP],
                        value=d.tokens_per_step, label="steps K (tokens revealed per pass = N/K)",
                        elem_id="tokens-per-step")
    blocks = gr.Radio([(f"N/{b}" if b > 1 else "N (one block)", b) for b in BLOCKS], value=d.blocks,
                      label="block length (blocks are filled left to right)")
    sampler = gr.Radio(list(SAMPLERS), value=d.sampler, label="sampler (which masks a pass reveals)",
                       elem_id="sampler", info="confidence: the most confident (or all above the threshold); "
                       "entropy: lowest entropy first within a bound (EB-sampler); dilated: never two neighbours in "
                       "one pass; revoke: tokens whose probability falls are masked again (WINO)")
    remasking = gr.Radio(list(REMASKING), value=d.remasking, label="remasking")
    threshold = gr.Slider(0, 1, value=d.threshold, step=0.05, label="confidence threshold (0 = off)",
                          info="samplers confidence, dilated and revoke")
    entropy_bound = gr.Slider(0, 3, value=d.entropy_bound, step=0.05, label="entropy bound, nats (0 = default "
                              f"{DEFAULT_ENTROPY_BOUND:g})", info="sampler entropy", elem_id="entropy-bound")
    revoke_below = gr.Slider(0, 0.95, value=d.revoke_below, step=0.05, label="re-mask below this probability "
                             f"(0 = default {DEFAULT_REVOKE_BELOW:g})", info="sampler revoke", elem_id="revoke-below")
    cache = gr.Radio(list(CACHES), value=d.cache, label="KV cache (Fast-dLLM)",
                     info="prefix: prompt and finished blocks; dual: also the masked suffix. Approximate.")
    flags = gr.CheckboxGroup(list(FLAG_FIELDS), value=list(d.flags), label="options", visible=bool(FLAG_FIELDS))
    plan = gr.Markdown(plan_text(d.max_new_tokens, d.tokens_per_step, d.blocks), elem_id="diffusion-plan")
    for control in (max_new, per_step, blocks):
        control.change(plan_text, [max_new, per_step, blocks], plan, api_visibility="undocumented",
                       show_progress="hidden", queue=False)
    return [max_new, temperature, top_p, seed, drafter, gamma, adaptive, per_step, blocks, remasking, threshold, cache,
            flags, tree, confidence, sampler, entropy_bound, revoke_below]


def plan_text(max_new_tokens: int, tokens_per_step: int, blocks: int) -> str:
    steps, block = diffusion_plan(max_new_tokens, tokens_per_step, blocks)
    n = int(max_new_tokens)
    return f"Diffusion will make **K = {steps}** passes over N = {n} tokens in {n // block} block(s) of {block}."
