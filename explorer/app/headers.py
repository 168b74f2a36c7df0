"""A lane's settings in words, for its header (and the run table): what the decode's config says, never more."""

from __future__ import annotations

from typing import Any


def lane_detail(method: str, config: dict[str, Any]) -> str:
    """A short description of a lane's settings for its header."""
    if method == "speculative":
        drafter = config.get("drafter", "model")
        drafter = "assistant (reads the target's features)" if drafter == "assistant" else drafter
        shape = f"tree {config['tree']}" if config.get("tree") else f"γ = {config.get('gamma')}"
        if config.get("draft_confidence") and not config.get("tree"):
            shape = f"γ ≤ {config.get('gamma')}, cut below {config['draft_confidence']:g}"
        return f"{drafter} drafter, {shape}"
    if method == "diffusion":
        n, sampler = config["max_new_tokens"], config.get("sampler") or "confidence"
        steps, block = config.get("steps") or n, config.get("block_length") or n
        knobs = [f"{name.replace('_', ' ')} {config[name]:g}" for name in ("threshold", "entropy_bound", "revoke_below")
                 if config.get(name)]
        fixed = sampler in ("confidence", "dilated") and not config.get("threshold")
        budget = f"K = {steps} steps" if fixed else f"at most K = {steps} passes (adaptive)"
        budget += ", plus one per re-mask" if sampler == "revoke" else ""
        knobs += ["no word twice in a row"] if config.get("no_adjacent_repeat") else []
        knobs += [f"no {config['no_repeat_ngram']}-token phrase twice"] if config.get("no_repeat_ngram") else []
        cache = f", cache {config['cache']}" if config.get("cache") else ""
        return (f"N = {n}, {budget}, blocks of {block}, sampler {sampler}"
                f"{' (' + ', '.join(knobs) + ')' if knobs else ''}{cache}")
    return "one target pass per token"
