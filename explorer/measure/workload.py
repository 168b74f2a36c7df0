"""Workloads: prompt sets (shipped or the user's own file) and output-quality scores.

A prompt file is either one prompt a line (plain text) or JSON Lines, one object a line:
``{"prompt": "...", "temperature": 1.2, "id": "optional", "category": "optional"}`` (a temperature
there overrides the run's for that prompt; a category names the prompt's group in
``explorer decide``). Multi-line prompts (code) need JSONL. Bad files raise one
ExplorerError sentence; very long files are cut to ``MAX_PROMPTS`` with a notice.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from explorer.decoding.events import Trace
from explorer.decoding.prompting import MAX_PROMPT_CHARS
from explorer.errors import ExplorerError
from explorer.runtime import ASSETS, Models

PROMPTS_DIR = ASSETS / "prompts"
SHIPPED = {
    "code": "code.jsonl",  # first lines of held-out stdlib functions (completion)
    "code_edit": "code_edit.jsonl",  # a function, then its renamed copy begins: the answer repeats the prompt
    "prose": "prose.txt",  # English sentence beginnings
    "multilingual": "multilingual.txt",  # German, French, Spanish sentence beginnings
    "high_temperature": "high_temperature.jsonl",  # a temperature per prompt (0.8-1.5)
    "chat": "chat.txt",  # instructions on held-out topics (the smollm2-135m preset's own kind of prompt)
}
MAX_PROMPTS = 1000
MAX_FILE_BYTES = 20_000_000


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    temperature: float | None = None  # None: the run's temperature
    category: str | None = None  # a JSONL line's "category" (the decision's groups); None: grouped automatically


@dataclass(frozen=True)
class PromptSet:
    name: str
    source: str
    prompts: tuple[Prompt, ...]
    notice: str | None = None  # e.g. "kept the first 1000 of 10000 prompts"


def load_prompt_sets(spec: str, limit: int | None = None) -> list[PromptSet]:
    """A comma-separated list of shipped set names and/or file paths."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ExplorerError("no prompt set given; name a shipped set "
                            f"({', '.join(SHIPPED)}) or a file")
    return [load_prompt_set(name, limit) for name in names]


def load_prompt_set(name_or_path: str, limit: int | None = None) -> PromptSet:
    """A shipped set by name, or a file (one prompt a line, or JSONL)."""
    if limit is not None and limit < 1:
        raise ExplorerError(f"--limit must be >= 1 (got {limit})")
    path = PROMPTS_DIR / SHIPPED[name_or_path] if name_or_path in SHIPPED else Path(name_or_path)
    name = name_or_path if name_or_path in SHIPPED else path.stem
    prompts = parse_prompts(read_prompt_text(path), str(path))
    notice = None
    cap = min(limit or MAX_PROMPTS, MAX_PROMPTS)
    if len(prompts) > MAX_PROMPTS and cap == MAX_PROMPTS:
        notice = f"{path}: kept the first {MAX_PROMPTS} of {len(prompts)} prompts (use --limit to choose fewer)"
    return PromptSet(name, str(path), tuple(prompts[:cap]), notice)


def read_prompt_text(path: Path) -> str:
    """The file's text, or one clear ExplorerError (missing, a folder, too big, binary, not UTF-8)."""
    if not path.exists():
        raise ExplorerError(f"prompt file {str(path)!r} not found; give a path or a shipped set: "
                            f"{', '.join(SHIPPED)}")
    if not path.is_file():
        raise ExplorerError(f"prompt file {str(path)!r} is not a regular file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ExplorerError(f"prompt file {str(path)!r} is larger than {MAX_FILE_BYTES // 1_000_000} MB")
    data = path.read_bytes()
    if b"\x00" in data:
        raise ExplorerError(f"prompt file {str(path)!r} looks binary (it contains NUL bytes); "
                            "expected UTF-8 text, one prompt a line or JSONL")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ExplorerError(f"prompt file {str(path)!r} is not UTF-8 text (byte {exc.start} is invalid)") from None


def parse_prompts(text: str, source: str) -> list[Prompt]:
    """JSONL when the file ends in .jsonl or every line starts with '{'; else one prompt a line."""
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not lines:
        raise ExplorerError(f"prompt file {source!r} is empty (no non-blank line)")
    jsonl = source.endswith(".jsonl") or all(line.lstrip().startswith("{") for _, line in lines)
    prompts = [_json_prompt(line, n, source) if jsonl else Prompt(f"line-{n}", line) for n, line in lines]
    for p in prompts:
        if len(p.text) > MAX_PROMPT_CHARS:
            raise ExplorerError(f"{source}: prompt {p.id} is longer than {MAX_PROMPT_CHARS} characters")
    return prompts


def _json_prompt(line: str, lineno: int, source: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ExplorerError(f"{source}, line {lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
        raise ExplorerError(f"{source}, line {lineno}: expected an object with a non-empty \"prompt\" string")
    temperature = obj.get("temperature")
    ok = temperature is None or (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
                                 and math.isfinite(temperature) and temperature >= 0)
    if not ok:
        raise ExplorerError(f"{source}, line {lineno}: temperature must be a number >= 0 (got {temperature!r})")
    category = obj.get("category")
    if category is not None and (not isinstance(category, str) or not category.strip()):
        raise ExplorerError(f"{source}, line {lineno}: category must be a non-empty string (got {category!r})")
    return Prompt(str(obj.get("id", f"line-{lineno}")), obj["prompt"], temperature,
                  category.strip() if category else None)


# ---------------------------------------------------------------------------------------------
# quality next to speed

def token_entropy_bits(token_ids: list[int]) -> float:
    """Shannon entropy (bits) of the output's own token frequencies; near 0 means repetition."""
    if not token_ids:
        return float("nan")
    counts = torch.tensor(list(Counter(token_ids).values()), dtype=torch.float64)
    p = counts / counts.sum()
    return float(-(p * torch.log2(p)).sum())


def distinct_ngram_ratio(tokens: list[int], n: int = 3) -> float:
    """Distinct n-grams over all n-grams of the output (1 = no n-gram repeats); NaN when it has fewer than n tokens."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def adjacent_repeat_rate(text: str) -> float:
    """Share of words that repeat the word just before them ("plants plants"), case-folded, punctuation ignored;
    NaN for fewer than two words. Code's own repeats (``x = x``) count too: compare against the target's rate."""
    words = re.findall(r"[^\W_]+(?:'[^\W_]+)?", text.lower())
    if len(words) < 2:
        return float("nan")
    return sum(a == b for a, b in zip(words, words[1:], strict=False)) / (len(words) - 1)


@torch.inference_mode()
def generative_perplexity(judge: torch.nn.Module, context_ids: list[int], output_ids: list[int]) -> float:
    """exp(mean NLL of the output tokens given the context) under the judge; NaN for no output."""
    if not output_ids:
        return float("nan")
    limit = int(getattr(judge.config, "max_position_embeddings", 0) or 2048)
    context_ids = context_ids[-max(1, limit - len(output_ids)):]  # keep the end of a long context
    ids = torch.tensor([context_ids + output_ids], device=judge.device)[:, -limit:]  # (1, T)
    n_out = min(len(output_ids), ids.shape[1] - 1)
    logits = judge(input_ids=ids).logits[0, -n_out - 1:-1].float()  # (n_out, V): predicts each output token
    nll = torch.nn.functional.cross_entropy(logits, ids[0, -n_out:], reduction="mean")
    return float(torch.exp(nll))


QUALITY_COLUMNS = ("perplexity", "token_entropy_bits", "distinct_3", "repeat_rate")  # what score_quality gives


def score_quality(models: Models, trace: Trace) -> dict[str, float]:
    """Generative perplexity under the preset's target (a fixed judge), token entropy, distinct 3-grams and the
    rate of adjacent repeated words."""
    context, output = trace.prompt_ids, trace.token_ids
    if trace.method == "diffusion" and models.diffusion_tokenizer is not models.tokenizer:
        # another tokenizer: the judge re-reads the text with its own
        context = list(models.tokenizer(trace.prompt).input_ids)
        output = list(models.tokenizer(trace.text).input_ids)
    return {"perplexity": generative_perplexity(models.target, context, output),
            "token_entropy_bits": token_entropy_bits(trace.token_ids),
            "distinct_3": distinct_ngram_ratio(trace.token_ids), "repeat_rate": adjacent_repeat_rate(trace.text)}


# ---------------------------------------------------------------------------------------------
# fixed-length runs (vLLM's --ignore-eos): every request produces exactly max_new_tokens

class _NoEosTokenizer:
    """Forwards everything to the real tokenizer but reports no EOS id, so decoders never stop early."""

    eos_token_id = None

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._tokenizer)


def ignoring_eos(models: Models) -> Models:
    """The same models, decoding to exactly max_new_tokens (for latency-against-length curves)."""
    tokenizer = _NoEosTokenizer(models.tokenizer)
    same = models.diffusion_tokenizer is models.tokenizer
    diffusion_tokenizer = tokenizer if same else _NoEosTokenizer(models.diffusion_tokenizer)
    return dataclasses.replace(models, tokenizer=tokenizer, diffusion_tokenizer=diffusion_tokenizer)
