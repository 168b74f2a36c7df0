"""The sidebar's decoding controls, made from the options' own description (``config.DecodeConfig``'s ``Control``
of each field, in ``lane_settings.PAGE`` order), and the diffusion plan line. A new option gets its control here
without a line of this file."""

from __future__ import annotations

from typing import Any

import gradio as gr

from explorer.app import hosting
from explorer.app.lane_settings import PAGE, SETTING_NAMES, diffusion_plan, preset_settings
from explorer.decoding.config import METHODS, OPTIONS, Control

GROUPS = {"all": "**All lanes**", "speculative": "**Speculative**",
          "diffusion": "**Diffusion** (K and the block length follow N)"}


def group(name: str) -> str:
    """Where an option sits: with all lanes, or with the one method family it is about (the diffusion KV cache
    with diffusion: the diffusion drafter uses it too)."""
    methods = OPTIONS[name].methods
    if "autoregressive" in methods or not methods:
        return "all"
    return "diffusion" if "diffusion" in methods else "speculative"


def make_control(c: Control, value: Any) -> Any:
    common = {"label": c.label, "info": c.info or None, "elem_id": c.elem_id}
    if c.kind == "slider":
        return gr.Slider(c.lo, c.hi, value=value, step=c.step, **common)
    if c.kind == "choice":
        return gr.Radio(list(c.choices), value=value, **common)
    if c.kind == "check":
        return gr.Checkbox(value, **common)
    if c.kind == "text":
        return gr.Textbox(value, **common)
    if c.kind == "number":
        return gr.Number(value, precision=0, **common)
    raise ValueError(f"unknown control kind {c.kind!r}")


def build_settings(c: Any, default_preset: str, speeds: list[tuple[str, str]], live: str) -> list[Any]:
    """The sidebar: preset, lanes and every decoding control; returns the Settings components in field order."""
    d = preset_settings(default_preset)
    choices, hidden_note = hosting.preset_choices()  # GPU presets only where CUDA is; random-gemma4 nowhere
    c.preset = gr.Dropdown(choices, value=default_preset, label="Preset", info=hidden_note)
    c.lanes = gr.CheckboxGroup(list(METHODS), value=list(METHODS), label="Lanes", elem_id="lane-choice",
                               info="autoregressive = the reference every speedup is measured against")
    c.speed = gr.Dropdown(speeds, value=live, label="Playback", elem_id="speed",
                          info="live is fastest; 'timed' decodes each lane alone, so its clock is honest, then "
                               "replays all of them on one clock at the pace chosen")
    made: dict[str, Any] = {}
    for key, heading in GROUPS.items():
        gr.Markdown(heading)
        for page, name, control in PAGE:
            if group(name) == key and not control.more:
                made[page] = make_control(control, getattr(d, page))
    with gr.Accordion("More options", open=False, elem_id="more-options"):
        for page, _, control in PAGE:
            if control.more:
                made[page] = make_control(control, getattr(d, page))
    plan = gr.Markdown(plan_text(d.max_new_tokens, d.tokens_per_step, d.blocks), elem_id="diffusion-plan")
    sizes = [made[n] for n in ("max_new_tokens", "tokens_per_step", "blocks")]
    for control in sizes:
        control.change(plan_text, sizes, plan, api_visibility="undocumented", show_progress="hidden", queue=False)
    return [made[n] for n in SETTING_NAMES]


def plan_text(max_new_tokens: int, tokens_per_step: int, blocks: int) -> str:
    steps, block = diffusion_plan(max_new_tokens, tokens_per_step, blocks)
    n = int(max_new_tokens)
    return f"Diffusion will make **K = {steps}** passes over N = {n} tokens in {n // block} block(s) of {block}."
