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
import subprocess
from pathlib import Path

import numpy as np
import torch

from explorer.errors import ExplorerError

SHARD = re.compile(r"shard_(\d{5})\.(pt|npz)$")
HISTORY_FOLDER = "data/smollm2-distill"  # where shards are committed, then removed from the working tree


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


def shard_temperature(i: int) -> float:
    """The data stage's rule, whichever generator made the shard: even shards greedy, odd ones temperature 1."""
    return 0.0 if i % 2 == 0 else 1.0


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


def compact_folder(src: Path, dest: Path, committed: set[str] = frozenset()) -> dict:
    """Write a compact copy of every shard in ``src`` into ``dest``, skipping those already there and those
    named in ``committed`` (the shards the history holds: ``history_files``)."""
    dest.mkdir(parents=True, exist_ok=True)
    made = 0
    for i, path in shard_paths(src).items():
        out = dest / f"shard_{i:05d}.npz"
        if not out.exists() and out.name not in committed:
            save_compact(out, load_shard(path))
            made += 1
    tokens = sum(int(np.load(p)["answer_lens"].sum()) for p in dest.glob("shard_*.npz"))
    return {"shards_made": made, "shards": len(list(dest.glob("shard_*.npz"))), "answer_tokens": tokens}


def git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        why = (getattr(exc, "stderr", None) or b"").decode().strip()[:200] or str(exc)
        raise ExplorerError(f"cannot read the shards from git in {repo}: {why}") from None


def read_blobs(repo: Path, specs: list[str]) -> list[bytes]:
    """The contents of ``commit:path`` objects, all through one ``git cat-file --batch``."""
    if not specs:
        return []
    out, at, blobs = git(repo, "cat-file", "--batch", stdin="\n".join(specs).encode() + b"\n"), 0, []
    for spec in specs:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        if len(header) != 3 or header[1] != b"blob":
            raise ExplorerError(f"cannot read {spec} from git in {repo}: {out[at:end].decode(errors='replace')}")
        size = int(header[2])
        blobs.append(out[end + 1:end + 1 + size])
        at = end + 1 + size + 1  # the content, then one newline
    return blobs


def history_versions(repo: Path, folder: str = HISTORY_FOLDER) -> dict[str, str]:
    """The compact shards and ``heldout_greedy.pt`` ever committed under ``folder`` in the history of HEAD, each
    with the newest commit that added or changed it (one ``git log``), in path order."""
    last: dict[str, str] = {}
    sha = ""
    for line in git(repo, "log", "--format=commit %H", "--name-only", "--diff-filter=AM", "HEAD", "--",
                    folder).decode().splitlines():
        if line.startswith("commit "):
            sha = line.split()[1]
        elif line.strip():
            last.setdefault(line.strip(), sha)  # newest first: the first commit seen is the last version
    return {p: last[p] for p in sorted(last)
            if p.endswith(".npz") and SHARD.search(p) or p.endswith("heldout_greedy.pt")}


def history_files(repo: Path, folder: str = HISTORY_FOLDER) -> list[str]:
    """The compact shards and ``heldout_greedy.pt`` ever added under ``folder`` in the history of HEAD."""
    return list(history_versions(repo, folder))


def restore_from_history(dest: Path, repo: Path, folder: str = HISTORY_FOLDER) -> dict:
    """Copy into ``dest`` every compact shard (and ``heldout_greedy.pt``) ever committed under ``folder`` in the
    history of ``repo``'s HEAD, each at its last committed version, skipping files ``dest`` has.

    The shards are committed once (``compact``, then ``git add``) and removed from the working tree in the next
    commit: the tree stays small (it travels to a GPU machine in 64 MiB calls) and the history keeps the data."""
    dest.mkdir(parents=True, exist_ok=True)
    versions = history_versions(repo, folder)
    wanted = [p for p in versions if not (dest / Path(p).name).exists()]
    for path, blob in zip(wanted, read_blobs(repo, [f"{versions[p]}:{p}" for p in wanted]), strict=True):
        out = dest / Path(path).name
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_bytes(blob)
        tmp.rename(out)
    copied = len(wanted)
    shards = list(dest.glob("shard_*.npz"))
    if not shards:
        raise ExplorerError(f"no compact shard under {folder} in the history of {repo}")
    return {"copied": copied, "shards": len(shards),
            "answer_tokens": sum(int(np.load(p)["answer_lens"].sum()) for p in shards)}
