"""Build (once per machine) and load the row-invariant C++ kernels (``rowinv.cpp``).

The build goes to ``~/.cache/decoding-explorer/rowinv/<hash of the source, torch version, CPU flags>``
(``EXPLORER_KERNEL_CACHE`` overrides the root); it takes about a minute and a half the first time and is
then reused. ``scripts/setup.sh`` builds it ahead of time so the app's first page load does not.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("rowinv.cpp")
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-std=c++17"]


class KernelUnavailable(RuntimeError):
    """No compiler, or the build failed: exact precisions cannot run here."""


def _cpu_flags() -> str:
    try:
        line = next((x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags")), "")
    except OSError:
        line = ""
    return " ".join(sorted(f for f in line.split() if f.startswith(("avx", "fma", "amx"))))


def build_dir() -> Path:
    root = Path(os.environ.get("EXPLORER_KERNEL_CACHE", Path.home() / ".cache" / "decoding-explorer" / "rowinv"))
    sources = SOURCE.read_bytes() + SOURCE.with_name("rowinv_simd.h").read_bytes()
    key = hashlib.sha1(sources + torch.__version__.encode() + _cpu_flags().encode()
                       + platform.machine().encode() + " ".join(FLAGS).encode()).hexdigest()[:12]
    return root / key


@functools.cache
def load() -> ModuleType:
    """The compiled module (``linear``, ``attend``, ``path``); KernelUnavailable with one line if it cannot be."""
    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        raise KernelUnavailable(f"no row-invariant kernel for a {platform.machine()} CPU")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise KernelUnavailable("no C++ compiler (c++) to build the row-invariant kernel")
    from torch.utils.cpp_extension import load as load_extension  # deferred: setuptools via torch.utils.cpp_extension

    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return load_extension(name=f"rowinv_{out.name}", sources=[str(SOURCE)], extra_cflags=FLAGS,
                              build_directory=str(out), verbose=False)
    except (RuntimeError, OSError, ImportError) as exc:
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise KernelUnavailable(f"building the row-invariant kernel failed ({first})") from None


def use_amx() -> bool:
    """Whether int8 weights go to the AMX tiles (same integers as the AVX-512 path, faster for several rows):
    compiled in, granted by the OS, and not turned off with EXPLORER_NO_AMX=1."""
    return os.environ.get("EXPLORER_NO_AMX", "") in ("", "0") and bool(load().has_amx())


def available() -> bool:
    try:
        load()
    except KernelUnavailable:
        return False
    return True
