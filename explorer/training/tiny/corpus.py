"""The corpus (the CPython standard library, split train / held-out by a hash of each path) and the byte-level
BPE tokenizer trained on it."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

EOS, PAD, MASK = "<|endoftext|>", "<|pad|>", "<|mask|>"
SPECIAL_TOKENS = [EOS, PAD, MASK]
SKIP_DIRS = ("test", "tests", "idlelib", "site-packages", "__pycache__", "pydoc_data")
HELDOUT_MOD = 20  # sha1(relative path) % 20 == 0 -> held-out


# --------------------------------------------------------------------------- corpus
def find_stdlib_files(root: Path) -> list[Path]:
    """Return the stdlib ``*.py`` files (sorted), skipping test/idle/site-packages dirs."""
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if not any(part in SKIP_DIRS for part in parts):
            files.append(path)
    return files


def is_heldout(rel_path: str) -> bool:
    """Deterministic split: a file is held-out when sha1(relative path) % 20 == 0."""
    return int(hashlib.sha1(rel_path.encode()).hexdigest(), 16) % HELDOUT_MOD == 0


def load_corpus(max_files: int | None = None) -> dict:
    """Read the running interpreter's stdlib and split it into train / held-out texts."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = find_stdlib_files(root)
    if max_files:
        files = pick_mini_files(files, root, max_files)
    train, heldout, skipped = [], [], 0
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        (heldout if is_heldout(rel) else train).append(text)
    return {"root": str(root), "train": train, "heldout": heldout,
            "skipped_non_utf8": skipped, "skip_dirs": list(SKIP_DIRS)}


def pick_mini_files(files: list[Path], root: Path, n: int) -> list[Path]:
    """Small, deterministic slice with both splits present (for ``--mini``)."""
    small = [p for p in files if p.stat().st_size < 20_000]
    held = [p for p in small if is_heldout(p.relative_to(root).as_posix())][:2]
    train = [p for p in small if p not in held][: n - len(held)]
    return sorted(train + held)


# ------------------------------------------------------------------------ tokenizer
def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style) with eos/bos, pad and mask special tokens.

    No post-processor: ``tokenizer(text).input_ids`` never adds a special token, and
    the ByteLevel decoder makes ``decode(encode(text)) == text`` for any text.
    """
    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=PAD,
        mask_token=MASK, clean_up_tokenization_spaces=False, model_max_length=512)


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Token ids of all documents joined by ``<|endoftext|>`` (one between each)."""
    eos = tokenizer.eos_token_id
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    ids: list[int] = []
    for enc in encodings:
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


def count_token_bytes(tokenizer) -> torch.Tensor:
    """UTF-8 bytes per token id (ByteLevel: one char per byte; special tokens = 1)."""
    table = torch.ones(len(tokenizer), dtype=torch.float64)
    special = set(tokenizer.all_special_ids)
    for token, idx in tokenizer.get_vocab().items():
        if idx not in special:
            table[idx] = len(token)
    return table
