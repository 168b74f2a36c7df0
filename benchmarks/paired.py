"""Greedy autoregressive against greedy speculative decoding, several bundles interleaved prompt by prompt (shared
by ``head_vocab.py`` and ``precision_speed.py``)."""

from __future__ import annotations

import explorer


def ar_and_spec(bundles: dict, prompts: list[str], tokens: int, gamma: int) -> dict:
    """Per prompt every bundle in turn: greedy AR, then greedy speculative at ``gamma``. Returns per bundle the summed
    tokens and seconds of each, the speculative target passes and how many outputs were equal; prints a line a run."""
    rows = {name: {"ar_tokens": 0, "ar_s": 0.0, "spec_tokens": 0, "spec_s": 0.0, "passes": 0, "equal": 0}
            for name in bundles}
    for i, prompt in enumerate(prompts):
        for name, models in bundles.items():
            ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=tokens)
            spec = explorer.decode("speculative", models, prompt, max_new_tokens=tokens, gamma=gamma)
            r = rows[name]
            r["ar_tokens"] += ar.stats["new_tokens"]
            r["ar_s"] += ar.stats["wall_s"]
            r["spec_tokens"] += spec.stats["new_tokens"]
            r["spec_s"] += spec.stats["wall_s"]
            r["passes"] += spec.stats["target_forward_passes"]
            r["equal"] += spec.token_ids == ar.token_ids
            print(f"prompt {i + 1}/{len(prompts)} {name}: AR {ar.stats['tokens_per_s']:.1f} tok/s, speculative "
                  f"{spec.stats['tokens_per_s']:.1f} tok/s, equal {spec.token_ids == ar.token_ids}", flush=True)
    return rows
