"""A prompt as token ids: the chat template for instruct presets, the tokenizer alone for plain ones (the decoders'
input; ``explorer.decoding.api.encode_prompt`` is this)."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> tuple[list[int], str]:
    """Plain presets: ``tokenizer(prompt).input_ids`` exactly; instruct presets: the chat template."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids), "chat_template"
    return list(tokenizer(prompt).input_ids), "raw"
