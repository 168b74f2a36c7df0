"""A prompt: checked as text (``validate_prompt``), then as token ids: the chat template for instruct presets, the
tokenizer alone for plain ones (the decoders' input; ``explorer.decoding.api.encode_prompt`` is this)."""

from __future__ import annotations

from typing import Any

from explorer.errors import ExplorerError

MAX_PROMPT_CHARS = 20_000


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ExplorerError(message)


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> tuple[list[int], str]:
    """Plain presets: ``tokenizer(prompt).input_ids`` exactly; instruct presets: the chat template."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids), "chat_template"
    return list(tokenizer(prompt).input_ids), "raw"


def validate_prompt(prompt: Any) -> str:
    """Text only: not empty, bounded, valid UTF-8, no control characters but tab and newlines."""
    if isinstance(prompt, bytes):
        try:
            prompt = prompt.decode("utf-8")
        except UnicodeDecodeError:
            raise ExplorerError("the prompt is not valid UTF-8 text") from None
    _require(isinstance(prompt, str), "the prompt must be text")
    _require(prompt.strip() != "", "the prompt is empty")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ExplorerError("the prompt is not valid UTF-8 text (it holds lone surrogates)") from None
    bad = next((c for c in prompt if (ord(c) < 32 and c not in "\t\n\r") or 0x7F <= ord(c) < 0xA0), None)
    _require(bad is None, f"the prompt contains a control character (U+{ord(bad or ' '):04X}); remove it")
    _require(len(prompt) <= MAX_PROMPT_CHARS, f"the prompt is too long ({len(prompt)} characters; "
             f"the limit is {MAX_PROMPT_CHARS})")
    return prompt
