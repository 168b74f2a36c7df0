"""The compact distillation shards: what is written is what is read, old and new shards load as one list, and a
compact row's one-hot teacher makes the draft's distillation loss the answer token's cross-entropy."""

import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from explorer.errors import ExplorerError
from explorer.training.smollm2.draft import distill_topk_loss
from explorer.training.smollm2.store import (
    HISTORY_FOLDER,
    compact_folder,
    history_files,
    load_compact,
    load_shard,
    restore_from_history,
    save_compact,
    shard_paths,
)


def _rows(seed: int, n: int = 5) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for k in range(n):
        p, a = int(torch.randint(3, 20, (), generator=g)), int(torch.randint(1, 40, (), generator=g))
        rows.append({"id": f"general:topic {seed}:{k}",
                     "prompt_ids": torch.randint(0, 49152, (p,), generator=g).tolist(),
                     "answer_ids": torch.randint(0, 49152, (a,), generator=g).tolist(), "temperature": float(k % 2)})
    return rows


def test_a_compact_shard_reads_back_the_rows_it_was_given(tmp_path):
    rows = _rows(0)
    save_compact(tmp_path / "shard_00000.npz", rows)
    back = load_compact(tmp_path / "shard_00000.npz")
    assert [(r["id"], r["prompt_ids"], r["answer_ids"], r["temperature"]) for r in back] == \
        [(r["id"], r["prompt_ids"], r["answer_ids"], r["temperature"]) for r in rows]
    for r in back:  # the one-hot teacher: the answer token with probability 1
        assert r["top_ids"].shape == (len(r["answer_ids"]), 1)
        assert r["top_ids"][:, 0].tolist() == r["answer_ids"] and float(r["top_lp"].abs().sum()) == 0
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically


def test_ids_that_do_not_fit_in_uint16_are_refused(tmp_path):
    rows = _rows(1)
    rows[2]["answer_ids"][0] = 70_000
    with pytest.raises(ValueError, match="uint16"):
        save_compact(tmp_path / "shard_00000.npz", rows)


def test_old_and_compact_shards_load_as_one_list_in_shard_order(tmp_path):
    old = _rows(2)
    for r in old:
        r["top_ids"] = torch.tensor(r["answer_ids"], dtype=torch.int32)[:, None].repeat(1, 3)
        r["top_lp"] = torch.full((len(r["answer_ids"]), 3), -1.0986, dtype=torch.float16)
    torch.save(old, tmp_path / "shard_00001.pt")
    save_compact(tmp_path / "shard_00000.npz", _rows(3))
    save_compact(tmp_path / "shard_00002.npz", _rows(4))
    paths = shard_paths(tmp_path)
    assert list(paths) == [0, 1, 2] and paths[1].suffix == ".pt"
    ids = [r["id"] for p in paths.values() for r in load_shard(p)]
    assert ids == [r["id"] for r in _rows(3) + old + _rows(4)]
    # a compact copy of shard 1 takes its place and holds the same answers
    info = compact_folder(tmp_path, tmp_path / "compact")
    assert info["shards"] == 3 and info["answer_tokens"] == sum(len(r["answer_ids"]) for r in
                                                                _rows(3) + old + _rows(4))
    save_compact(tmp_path / "shard_00001.npz", load_shard(paths[1]))  # beside the old form, the compact one wins
    assert shard_paths(tmp_path)[1].suffix == ".npz"
    np.testing.assert_array_equal(load_compact(tmp_path / "compact" / "shard_00001.npz")[0]["answer_ids"],
                                  old[0]["answer_ids"])


def test_the_one_hot_teacher_makes_the_distillation_loss_the_answer_cross_entropy(tmp_path):
    rows = _rows(5, n=3)
    save_compact(tmp_path / "shard_00000.npz", rows)
    back = load_compact(tmp_path / "shard_00000.npz")
    answers = torch.tensor([i % 97 for r in back for i in r["answer_ids"]])  # kept-index space of 97 tokens
    top = torch.cat([r["top_ids"] for r in back]).long() % 97
    logits = torch.randn(len(answers), 97, generator=torch.Generator().manual_seed(0))
    loss = distill_topk_loss(logits, top, torch.cat([r["top_lp"] for r in back]).float())
    torch.testing.assert_close(loss, F.cross_entropy(logits, answers))


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_shards_removed_from_the_tree_come_back_from_the_history(tmp_path):
    """The shards are committed, then removed from the working tree; ``restore`` brings each back at its last
    committed version, and ``compact`` does not write a committed shard into the tree again."""
    repo, folder = tmp_path / "repo", tmp_path / "repo" / HISTORY_FOLDER
    folder.mkdir(parents=True)
    _git(repo, "init", "-q")
    save_compact(folder / "shard_00000.npz", _rows(0))
    save_compact(folder / "shard_00001.npz", _rows(9))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "shards 0-1")
    save_compact(folder / "shard_00001.npz", _rows(1))  # a shard rewritten: its last version counts
    (folder / "README.md").write_text("not a shard")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "shard 1 again")
    _git(repo, "rm", "-q", str(folder / "shard_00000.npz"), str(folder / "shard_00001.npz"))
    _git(repo, "commit", "-qm", "shards out of the tree")
    assert history_files(repo) == [f"{HISTORY_FOLDER}/shard_00000.npz", f"{HISTORY_FOLDER}/shard_00001.npz"]
    info = restore_from_history(tmp_path / "work", repo)
    assert info == {"copied": 2, "shards": 2, "answer_tokens": sum(len(r["answer_ids"]) for s in (0, 1)
                                                                   for r in _rows(s))}
    for i, seed in ((0, 0), (1, 1)):
        back = load_compact(tmp_path / "work" / f"shard_{i:05d}.npz")
        assert [r["answer_ids"] for r in back] == [r["answer_ids"] for r in _rows(seed)]
    assert restore_from_history(tmp_path / "work", repo)["copied"] == 0  # resumable: nothing twice
    # compact: a new shard goes into the tree, a committed one does not
    save_compact(tmp_path / "work" / "shard_00002.npz", _rows(2))
    made = compact_folder(tmp_path / "work", folder, {p.rsplit("/", 1)[1] for p in history_files(repo)})
    assert made["shards_made"] == 1 and sorted(p.name for p in folder.glob("shard_*")) == ["shard_00002.npz"]


def test_restore_without_shards_in_the_history_is_one_clear_error(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "x").write_text("x")
    _git(tmp_path, "add", "x")
    _git(tmp_path, "commit", "-qm", "no shards")
    with pytest.raises(ExplorerError, match="no compact shard under data/smollm2-distill"):
        restore_from_history(tmp_path / "work", tmp_path)
    with pytest.raises(ExplorerError, match="cannot read the shards from git"):
        restore_from_history(tmp_path / "work", tmp_path / "not-a-repo")
