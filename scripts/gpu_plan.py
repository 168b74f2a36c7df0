"""Moving the default preset's target (a 98 MB GGUF) and the missing wheels to a lent GPU machine, in calls that each
fit the device tool's limit on what travels (the working tree plus the carried paths, 64 MiB a call).

Standard library only: the same file runs here (``plan``, from scripts/gpu_prepare.sh) and there (``stage``,
``verify``, from scripts/gpu_check.sh under the machine's own python3).

    python scripts/gpu_plan.py plan --gguf FILE [--wheels .gpu/wheels] [--tree-mib N] [--margin-mib 2]
    python3 scripts/gpu_plan.py stage K      # there: append chunk K to .gpu/target/<name>, checking its sha256
    python3 scripts/gpu_plan.py verify       # there: the assembled GGUF's size and sha256

``plan`` splits the GGUF into ``.gpu/chunks/NN.part``, writes ``.gpu/manifest.json`` and prints the device ``run``
calls to make, in order, each with its command and carry list. The chunk size is computed from what travels anyway
(tracked and untracked-not-ignored files, ``shared/``), so it follows the tree as it shrinks or grows. The wheels and
the CPU baseline travel in the first call, which installs them and tries the stack there; the last call
runs the check.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_DIR = ".gpu"  # ignored (.git/info/exclude): chunks, wheels, manifest here; the assembled GGUF and site/ there
MANIFEST = f"{GPU_DIR}/manifest.json"
WHEELS = f"{GPU_DIR}/wheels"
BASELINE = f"{GPU_DIR}/cpu_baseline.json"
LIMIT = 64 * 2**20  # the device tool: the working tree that travels, carried paths included, per call
MARGIN = 2 * 2**20  # headroom for files that appear between planning and the call (a note, a report)
MANIFEST_ALLOWANCE = 64 * 2**10  # the manifest travels in every call; it is a few kB
CHECK_TIMEOUT_S = 560  # the final call's timeout_s: gpu_check.sh stops the check itself well before


class PlanError(Exception):
    pass


@dataclass
class Chunk:
    index: int
    path: str
    offset: int
    bytes: int
    sha256: str = ""


@dataclass
class Call:
    index: int  # 1-based, in the order the calls are made
    command: str
    carry: list[str]
    carried_bytes: int
    chunk: int | None = None  # the chunk this call appends
    final: bool = False


@dataclass
class Plan:
    tree_bytes: int
    gguf_bytes: int
    extra_bytes: int  # wheels + baseline, in the first call
    room: int  # bytes a call can carry beside the tree
    chunks: list[Chunk] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- measuring

def travelling_files(root: Path = ROOT) -> list[str]:
    """What a device call copies besides the carried paths: tracked files and untracked files git does not ignore,
    and ``shared/`` where the checkout has one."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    files = [f for f in out.split("\0") if f]
    shared = root / "shared"
    if shared.is_dir():
        files += [str(p.relative_to(root)) for p in shared.rglob("*") if not p.is_dir()]
    return sorted(set(files))


def path_bytes(path: Path) -> int:
    """Apparent size of a file, a link (its own size: a link travels as a link) or a folder's files."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    if path.is_dir():
        return sum(p.lstat().st_size for p in path.rglob("*") if p.is_symlink() or p.is_file())
    return 0


def tree_bytes(root: Path = ROOT) -> int:
    return sum(path_bytes(root / f) for f in travelling_files(root))  # a deleted tracked file counts 0


def sha256_file(path: Path, offset: int = 0, length: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length if length is not None else math.inf
        while left > 0:
            block = f.read(int(min(left, 4 * 2**20)))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- planning

def plan_calls(tree: int, gguf: int, extra: int, limit: int = LIMIT, margin: int = MARGIN,
               fixed: int = MANIFEST_ALLOWANCE, with_baseline: bool = False) -> Plan:
    """The fewest calls that carry ``gguf`` bytes plus ``extra`` (wheels, baseline) beside a tree of ``tree`` bytes.
    The first call carries the extras and fills up with the GGUF's first chunk: it installs the wheels and tries the
    stack on the device (``--setup``), so a machine that cannot run the check says so before the other calls are
    spent; the rest of the GGUF is shared evenly by the calls after it; the last one runs the check. Raises
    PlanError when the tree leaves no room for the extras."""
    room = limit - margin - tree - fixed
    if room <= extra:
        raise PlanError(f"the tree that travels is {tree / 2**20:.1f} MiB: with the {margin / 2**20:.0f} MiB margin "
                        f"a call has {max(room, 0) / 2**20:.1f} MiB left, and the first call alone needs "
                        f"{extra / 2**20:.1f} MiB for the wheels and the baseline. Shrink the tree (issue 26 "
                        f"part 1 aims at 40 MiB) or carry fewer wheels.")
    first = min(gguf, room - extra)
    after = math.ceil((gguf - first) / room)  # the calls after the first share the rest evenly
    n_calls = after + 1
    sizes = [(gguf - first) // after + (i < (gguf - first) % after) for i in range(after)] if after else []
    plan = Plan(tree, gguf, extra, room)
    offset = 0
    for size in [first, *sizes]:
        if size > 0:
            plan.chunks.append(Chunk(len(plan.chunks), f"{GPU_DIR}/chunks/{len(plan.chunks):02d}.part", offset, size))
            offset += size
    assert offset == gguf and all(c.bytes <= room for c in plan.chunks)
    for i in range(n_calls):
        chunk = plan.chunks[i] if i < len(plan.chunks) else None
        carry = [MANIFEST] + ([chunk.path] if chunk else [])
        carried = fixed + (chunk.bytes if chunk else 0)
        if i == 0:
            carry += [WHEELS] + ([BASELINE] if with_baseline else [])
            carried += extra
        flags = (" --setup" if i == 0 else "") + (f" --stage {chunk.index}" if chunk else "") + \
            (" --run" if i == n_calls - 1 else "")
        command = ("PYTHONUNBUFFERED=1 " if i == n_calls - 1 else "") + f"bash scripts/gpu_check.sh{flags}"
        plan.calls.append(Call(i + 1, command, carry, carried, chunk.index if chunk else None, i == n_calls - 1))
    return plan


def split(gguf: Path, plan: Plan, root: Path = ROOT) -> None:
    """Write the chunks (old ones removed first) and fill in their sha256."""
    folder = root / GPU_DIR / "chunks"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.part"):
        old.unlink()
    with open(gguf, "rb") as src:
        for chunk in plan.chunks:
            src.seek(chunk.offset)
            h, left = hashlib.sha256(), chunk.bytes
            with open(root / chunk.path, "wb") as dst:
                while left:
                    block = src.read(min(left, 4 * 2**20))
                    h.update(block)
                    dst.write(block)
                    left -= len(block)
            chunk.sha256 = h.hexdigest()


def render(plan: Plan, manifest: dict, timeout_s: int = CHECK_TIMEOUT_S) -> str:
    mib = 2**20
    lines = [f"tree that travels: {plan.tree_bytes / mib:.1f} MiB; room per call beside it: {plan.room / mib:.1f} "
             f"MiB; GGUF {plan.gguf_bytes / mib:.1f} MiB ({manifest['gguf']['sha256']}); wheels and baseline "
             f"{plan.extra_bytes / mib:.1f} MiB: {len(plan.calls)} device call(s).",
             "Make them back to back: a machine stays warm 30 s after a call, and the wheels and the GGUF's pieces",
             "live on it only while warm; a stage that finds its predecessors gone says so: start at call 1 again.",
             "Call 1 also installs the wheels and decodes on the device (--setup): if that fails, stop and read why.",
             ""]
    for call in plan.calls:
        what = f"chunk {call.chunk} ({plan.chunks[call.chunk].bytes} bytes, sha256 " \
               f"{plan.chunks[call.chunk].sha256})" if call.chunk is not None else "no chunk"
        timeout = f", timeout_s={timeout_s}" if call.final else ", timeout_s=120"
        lines += [f"call {call.index}/{len(plan.calls)}: {what}; carries {call.carried_bytes / mib:.1f} MiB, "
                  f"{(plan.tree_bytes + call.carried_bytes) / mib:.1f} MiB in all",
                  f"  run(command={json.dumps(call.command)}, carry={json.dumps(call.carry)}{timeout})"]
    lines += ["", "The report comes back in the last call's files: gpu_check.json, gpu_check.md, gpu_check.log "
              "(under files_at)."]
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    gguf = Path(args.gguf)
    wheels = sorted((root / WHEELS).glob("*.whl"))
    if not wheels:
        raise PlanError(f"no wheels in {WHEELS}: scripts/gpu_prepare.sh downloads them first")
    baseline = root / BASELINE
    extra = sum(w.stat().st_size for w in wheels) + (baseline.stat().st_size if baseline.exists() else 0)
    tree = int(args.tree_mib * 2**20) if args.tree_mib is not None else tree_bytes(root)
    plan = plan_calls(tree, gguf.stat().st_size, extra, margin=int(args.margin_mib * 2**20),
                      with_baseline=baseline.exists())
    if args.dry:  # planning only (as if the tree were --tree-mib): no chunks written, no manifest
        for c in plan.chunks:
            c.sha256 = sha256_file(gguf, c.offset, c.bytes)
    else:
        split(gguf, plan, root)
    manifest = make_manifest(gguf, plan, [w.name for w in wheels], baseline.exists())
    if not args.dry:
        (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(render(plan, manifest))
    return 0


def make_manifest(gguf: Path, plan: Plan, wheels: list[str], baseline: bool) -> dict:
    return {"gguf": {"name": gguf.name, "bytes": gguf.stat().st_size, "sha256": sha256_file(gguf)},
            "chunks": [asdict(c) for c in plan.chunks], "wheels": wheels, "baseline": baseline,
            "tree_bytes": plan.tree_bytes, "limit": LIMIT, "calls": [asdict(c) for c in plan.calls]}


# ---------------------------------------------------------------------------------------------- there

def target_path(root: Path, manifest: dict) -> Path:
    return root / GPU_DIR / "target" / manifest["gguf"]["name"]


def stage(root: Path, k: int) -> Path:
    """Append chunk ``k`` to the GGUF being assembled, after checking the chunk and what earlier stages left."""
    manifest = json.loads((root / MANIFEST).read_text())
    chunks = manifest["chunks"]
    if not 0 <= k < len(chunks):
        raise PlanError(f"no chunk {k}: the manifest has {len(chunks)}")
    chunk, target = chunks[k], target_path(root, manifest)
    target.parent.mkdir(parents=True, exist_ok=True)
    have = target.stat().st_size if target.exists() else 0
    if k > 0 and have == chunk["offset"] + chunk["bytes"] and \
            sha256_file(target, chunk["offset"], chunk["bytes"]) == chunk["sha256"]:
        print(f"stage {k}: already appended")
        return target
    if k > 0 and have != chunk["offset"]:
        raise PlanError(f"stage {k} expects the first {chunk['offset']} bytes from stages 0..{k - 1} in {target}, "
                        f"found {have}: the machine was given back between calls (a fresh one is bare), or a stage "
                        "was skipped. Start again at call 1.")
    source = root / chunk["path"]
    if not source.exists() or source.stat().st_size != chunk["bytes"] or sha256_file(source) != chunk["sha256"]:
        raise PlanError(f"chunk {k} ({source}) is missing or damaged: was it carried?")
    with open(target, "wb" if k == 0 else "ab") as out, open(source, "rb") as src:
        while block := src.read(4 * 2**20):
            out.write(block)
    print(f"stage {k}: {target} now {target.stat().st_size} of {manifest['gguf']['bytes']} bytes")
    return target


def verify(root: Path) -> Path:
    manifest = json.loads((root / MANIFEST).read_text())
    target, want = target_path(root, manifest), manifest["gguf"]
    have = target.stat().st_size if target.exists() else 0
    if have != want["bytes"] or sha256_file(target) != want["sha256"]:
        raise PlanError(f"{target}: {have} of {want['bytes']} bytes or a wrong sha256: the stages did not all land "
                        "on this machine. Start again at call 1.")
    print(f"verified: {target} sha256 {want['sha256']}")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(ROOT))
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="split the GGUF, write the manifest, print the device calls (here)")
    p.add_argument("--gguf", required=True)
    p.add_argument("--tree-mib", type=float, default=None, help="plan as if the travelling tree were this size")
    p.add_argument("--margin-mib", type=float, default=MARGIN / 2**20)
    p.add_argument("--dry", action="store_true", help="print the plan only: write no chunks and no manifest")
    s = sub.add_parser("stage", help="append chunk K to the GGUF being assembled (there)")
    s.add_argument("k", type=int)
    sub.add_parser("verify", help="check the assembled GGUF (there)")
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "stage":
            stage(Path(args.root), args.k)
        else:
            verify(Path(args.root))
    except PlanError as exc:
        if args.command == "plan" and not args.dry:  # no stale plan left behind for a later run to follow
            root = Path(args.root)
            for stale in [root / MANIFEST, *(root / GPU_DIR / "chunks").glob("*.part")]:
                stale.unlink(missing_ok=True)
        print(f"gpu_plan: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
