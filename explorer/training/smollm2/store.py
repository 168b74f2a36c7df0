"""Distillation shards on disk: the compact form (token ids only) and the old one (with the teacher's top-k).

A compact shard ``shard_NNNNN.npz`` holds what training cannot recompute cheaply, the target's own answers:
prompt and answer token ids as uint16 (the vocabulary has 49,152 entries), one length per row, the sampling
temperature and the prompt's id: about 2 bytes per answer token, against about 120 for an old ``.pt`` shard
with its top-20 log-probs. What the old shards also stored is recomputed or replaced: the target's hidden
states by a teacher-forced pass (the ``eagle`` stage), and the teacher's top-k by the answer token itself
(a compact row's ``top_ids`` is the answer token with log-prob 0, a one-hot teacher: sequence-level
distillation, Kim & Rush 2016).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

SHARD = re.compile(r"shard_(\d{5})\.(pt|npz)$")


def save_compact(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` (dicts with ``id``, ``prompt_ids``, ``answer_ids``, ``temperature``) atomically."""
    path = Path(path)
    cat = [i for r in rows for i in r["prompt_ids"]] + [i for r in rows for i in r["answer_ids"]]
    if cat and (min(cat) < 0 or max(cat) > np.iinfo(np.uint16).max):
        raise ValueError("token ids must fit in uint16 for a compact shard")
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(
        tmp,
        prompt_ids=np.array([i for r in rows for i in r["prompt_ids"]], dtype=np.uint16),
        answer_ids=np.array([i for r in rows for i in r["answer_ids"]], dtype=np.uint16),
        prompt_lens=np.array([len(r["prompt_ids"]) for r in rows], dtype=np.int32),
        answer_lens=np.array([len(r["answer_ids"]) for r in rows], dtype=np.int32),
        temperature=np.array([float(r.get("temperature", 0.0)) for r in rows], dtype=np.float32),
        ids=np.array([str(r.get("id", "")) for r in rows]),
    )
    tmp.rename(path)


def load_compact(path: Path) -> list[dict]:
    """The rows of a compact shard, with the one-hot teacher (``top_ids`` (n, 1), ``top_lp`` zeros)."""
    with np.load(path) as z:
        p_ids, a_ids = z["prompt_ids"].astype(np.int64), z["answer_ids"].astype(np.int64)
        p_len, a_len, temp, ids = z["prompt_lens"], z["answer_lens"], z["temperature"], z["ids"]
    rows, p0, a0 = [], 0, 0
    for k in range(len(p_len)):
        prompt, answer = p_ids[p0:p0 + p_len[k]].tolist(), a_ids[a0:a0 + a_len[k]].tolist()
        p0, a0 = p0 + int(p_len[k]), a0 + int(a_len[k])
        rows.append({"id": str(ids[k]), "prompt_ids": prompt, "answer_ids": answer,
                     "top_ids": torch.tensor(answer, dtype=torch.int32)[:, None],
                     "top_lp": torch.zeros((len(answer), 1), dtype=torch.float16),
                     "temperature": float(temp[k])})
    return rows


def shard_paths(folder: Path) -> dict[int, Path]:
    """Shard index -> file, for both forms; where both exist the compact one wins (they hold the same rows)."""
    found: dict[int, Path] = {}
    for path in sorted(Path(folder).glob("shard_*")):
        m = SHARD.search(path.name)
        if m and (int(m.group(1)) not in found or m.group(2) == "npz"):
            found[int(m.group(1))] = path
    return dict(sorted(found.items()))


def load_shard(path: Path) -> list[dict]:
    return load_compact(path) if Path(path).suffix == ".npz" else torch.load(path)


def compact_folder(src: Path, dest: Path) -> dict:
    """Write a compact copy of every shard in ``src`` into ``dest`` (skipping those already there)."""
    dest.mkdir(parents=True, exist_ok=True)
    made = 0
    for i, path in shard_paths(src).items():
        out = dest / f"shard_{i:05d}.npz"
        if not out.exists():
            save_compact(out, load_shard(path))
            made += 1
    tokens = sum(int(np.load(p)["answer_lens"].sum()) for p in dest.glob("shard_*.npz"))
    return {"shards_made": made, "shards": len(list(dest.glob("shard_*.npz"))), "answer_tokens": tokens}
