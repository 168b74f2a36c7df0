"""``python -m explorer.train smollm2 STAGE``: argument parsing and one clear error line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from explorer.errors import ExplorerError
from explorer.training.smollm2.common import DEFAULT_WORK
from explorer.training.smollm2.data import generate_data
from explorer.training.smollm2.diffusion import train_diffusion
from explorer.training.smollm2.draft import train_draft
from explorer.training.smollm2.eagle import FUSE_LAYERS, train_eagle
from explorer.training.smollm2.export import export
from explorer.training.smollm2.selfdata import generate_self_data
from explorer.training.smollm2.store import HISTORY_FOLDER, compact_folder, history_files, restore_from_history

REPO = Path(__file__).resolve().parents[3]  # the shards live in this repository's history (store.py)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m explorer.train smollm2",
                                 description="Train the SmolLM2-135M draft and diffusion partner (CPU, resumable).")
    ap.add_argument("stage", choices=["restore", "data", "compact", "draft", "eagle", "diffusion", "selfdata",
                                          "export"],
                    help="which stage to run")
    ap.add_argument("--work-dir", type=Path, default=DEFAULT_WORK, help="checkpoints and data (default %(default)s)")
    ap.add_argument("--budget-min", type=float, default=30.0, help="wall-clock budget of this run, in minutes")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: leave a core free)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompt order and sampling")
    ap.add_argument("--batch", type=int, default=None, help="batch size (data: prompts per shard)")
    ap.add_argument("--max-new", type=int, default=256, help="data: longest answer generated")
    ap.add_argument("--part", type=int, default=0, help="data: this process's share (0 .. parts-1)")
    ap.add_argument("--parts", type=int, default=1, help="data: how many processes share the prompts")
    ap.add_argument("--layers", type=int, default=4, help="draft: decoder layers copied from the target")
    ap.add_argument("--keep-vocab", type=int, default=None,
                    help="draft, eagle: size of the trimmed head (FR-Spec; default 8192 draft, 16384 eagle); "
                         "export: ship the EAGLE head with only its this many most frequent tokens")
    ap.add_argument("--depths", type=int, default=3, help="eagle: drafting steps unrolled in training")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="draft, eagle, diffusion: start from an exported folder (e.g. assets/models/smollm2-135m/"
                         "draft, .../eagle or .../diffusion) when the work dir has no checkpoint")
    ap.add_argument("--engine", choices=["torch", "vllm"], default="torch",
                    help="data: generate with transformers in this process, or with vLLM's CPU engine (~5x faster; "
                    "bfloat16; installs the engine venv on first use)")
    ap.add_argument("--cores", default=None,
                    help="data --engine vllm: the CPU cores vLLM binds, e.g. 1 or 0-1 (default: the first --threads)")
    ap.add_argument("--fuse", action="store_true",
                    help="eagle: EAGLE-3's fused features (decoder layers 2 and 14 beside the final feature); a head "
                         "trained without them carries over")
    ap.add_argument("--bf16", action="store_true",
                    help="eagle, diffusion: bfloat16 autocast for forward and backward (a CPU with native bf16)")
    ap.add_argument("--certainty", type=float, default=0.0,
                    help="diffusion: weight of certainty forcing (entropy of right guesses; 0 = plain training)")
    ap.add_argument("--self-mix", type=float, default=0.0,
                    help="diffusion: fraction of the rows that are the partner's own answers (run selfdata first)")
    ap.add_argument("--lora-rank", type=int, default=16, help="diffusion: LoRA rank")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate")
    ap.add_argument("--out", type=Path, default=None, help="export: destination (default assets/models/smollm2-135m); "
                    "compact: where the new compact shards go (default data/smollm2-distill)")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        if args.threads < 1:
            raise ExplorerError(f"--threads must be >= 1 (got {args.threads})")
        torch.set_num_threads(args.threads)
        work = args.work_dir.expanduser()
        try:
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ExplorerError(f"cannot use --work-dir {work}: {exc.strerror}") from None
        if args.stage == "data":
            if not 0 <= args.part < args.parts:
                raise ExplorerError(f"--part must be in 0 .. {args.parts - 1} (got {args.part})")
            generate_data(work, args.budget_min, batch=args.batch or 32, max_new=args.max_new, seed=args.seed,
                          part=args.part, parts=args.parts, engine=args.engine,
                          cores=args.cores or (f"0-{args.threads - 1}" if args.threads > 1 else "0"))
        elif args.stage == "restore":
            print(json.dumps(restore_from_history(work / "data", REPO)))
            heldout = work / "data" / "heldout_greedy.pt"
            if heldout.exists() and not (work / heldout.name).exists():
                heldout.rename(work / heldout.name)
        elif args.stage == "compact":
            committed = {Path(p).name for p in history_files(REPO)}
            print(json.dumps(compact_folder(work / "data", args.out or REPO / HISTORY_FOLDER, committed)))
        elif args.stage == "draft":
            train_draft(work, args.budget_min, layers=args.layers, keep_vocab=args.keep_vocab or 8192,
                        batch=args.batch or 8, lr=args.lr or 3e-4, seed=args.seed, init_from=args.init_from)
        elif args.stage == "eagle":
            train_eagle(work, args.budget_min, keep_vocab=args.keep_vocab or 16384, depths=args.depths,
                        batch=args.batch or 8, lr=args.lr or 5e-4, seed=args.seed, init_from=args.init_from,
                        bf16=args.bf16, fuse_layers=FUSE_LAYERS if args.fuse else ())
        elif args.stage == "diffusion":
            train_diffusion(work, args.budget_min, rank=args.lora_rank, batch=args.batch or 4,
                            lr=args.lr or 5e-4, seed=args.seed, init_from=args.init_from, bf16=args.bf16,
                            certainty=args.certainty, self_mix=args.self_mix)
        elif args.stage == "selfdata":
            if not 0 <= args.part < args.parts:
                raise ExplorerError(f"--part must be in 0 .. {args.parts - 1} (got {args.part})")
            print(json.dumps(generate_self_data(work, args.budget_min, part=args.part, parts=args.parts)))
        elif args.stage == "export":
            export(work, args.out, eagle_vocab=args.keep_vocab)
    except ExplorerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
