"""Build (once per machine and SIMD path) and load the row-invariant C++ kernels (``rowinv.cpp``).

One path per instruction set, chosen at run time as llama.cpp and ATen's DispatchStub choose theirs: ``amx`` (Intel
AMX tiles for int8, AVX-512 for the rest), ``avx512``, ``avx2`` (AVX2 + FMA: x86-64-v3), ``neon`` (aarch64) or
``portable`` (plain C++). The best one this CPU has is the default; ``EXPLORER_KERNEL_ISA`` forces another (any
machine can build, test and benchmark the AVX2 path). Every path gives the same bits (``rowinv_simd.h``).

Each path builds into its own folder, ``~/.cache/decoding-explorer/rowinv/<path>-<hash of the sources, torch
version, CPU flags, compiler flags>`` (``EXPLORER_KERNEL_CACHE`` overrides the root); a build takes about a minute
and a half and is then reused. ``scripts/setup.sh`` builds the default path ahead of time so the app's first page
load does not. ``rowinv_check.cpp`` is the same kernels without torch: ``check_path`` compiles and runs it (seconds)
to check a path's bits, natively or cross-compiled for aarch64 under qemu.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).parent
SOURCE = HERE / "rowinv.cpp"
HEADERS = (HERE / "rowinv_simd.h", HERE / "rowinv_core.h")
CHECK_SOURCE = HERE / "rowinv_check.cpp"
COMMON = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c++17"]
ISAS = ("amx", "avx512", "avx2", "neon", "portable")  # best first
ENV = "EXPLORER_KERNEL_ISA"
X86 = ("x86_64", "AMD64", "i386", "i686")
ARM = ("aarch64", "arm64")


class KernelUnavailable(RuntimeError):
    """No compiler, the build failed, or the forced path is not this CPU's: exact precisions cannot run here."""


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((x for x in text.splitlines() if x.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


def cpu_isas(flags: frozenset[str] | set[str] | None = None, machine: str | None = None) -> list[str]:
    """The kernel paths this CPU can run, best first (``portable`` always)."""
    flags = _cpu_flags() if flags is None else flags
    machine = machine or platform.machine()
    out = []
    if machine in X86:
        avx512 = {"avx512f", "avx512bw", "avx512vl"} <= flags
        if avx512 and {"amx_tile", "amx_int8"} <= flags:
            out.append("amx")
        if avx512:
            out.append("avx512")
        if {"avx2", "fma"} <= flags:
            out.append("avx2")
    elif machine in ARM:
        out.append("neon")  # Advanced SIMD is part of every aarch64 CPU
    return out + ["portable"]


def compile_flags(isa: str, cross: bool = False) -> list[str]:
    """Compiler flags of a path: the CPU's own (-march=native) less the instruction sets above the path, and a
    define that picks it in rowinv_simd.h (``cross``: for another aarch64 CPU than this one)."""
    machine = "aarch64" if cross else platform.machine()
    if isa == "amx":
        return ["-march=native", "-DROWINV_PATH_AVX512", "-DROWINV_WITH_AMX"]
    if isa == "avx512":
        return ["-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16", "-DROWINV_PATH_AVX512"]
    if isa == "avx2":  # x86-64-v3: what every AVX2 CPU has, nothing of AVX-512 even where the CPU has it
        return ["-march=x86-64-v3", "-mtune=native", "-DROWINV_PATH_AVX2"]
    if isa == "neon":
        return ["-march=armv8-a" if cross else "-mcpu=native", "-DROWINV_PATH_NEON"]
    if machine in X86:
        return ["-march=x86-64", "-mtune=native", "-DROWINV_PATH_PORTABLE"]
    return ["-DROWINV_PATH_PORTABLE"]


def thread_flags() -> list[str]:
    """Compile (and link) at::parallel_for's OpenMP pragmas in: ATen's OpenMP backend is a header, and a build
    without -fopenmp runs every "parallel" range on the calling thread alone. The extension then shares the
    libgomp torch loaded (same soname). Not on macOS (Apple's clang has no -fopenmp) or a non-OpenMP torch."""
    if platform.system() == "Darwin" or "OpenMP" not in torch.__config__.parallel_info() or os.environ.get(
            "EXPLORER_KERNEL_OPENMP") == "0":
        return []
    return ["-fopenmp"]


def chosen_isa() -> str:
    """The path to build: ``EXPLORER_KERNEL_ISA`` if set (KernelUnavailable, one line, if this CPU lacks it), else
    the best this CPU has."""
    have = cpu_isas()
    forced = os.environ.get(ENV, "").strip().lower()
    if not forced:
        return have[0]
    if forced not in ISAS:
        raise KernelUnavailable(f"{ENV}={forced}: unknown kernel path; choose one of {', '.join(ISAS)}")
    if forced not in have:
        raise KernelUnavailable(f"{ENV}={forced}: this CPU ({platform.machine()}) cannot run that path; "
                                f"it can run {', '.join(have)}")
    return forced


def build_dir(isa: str | None = None) -> Path:
    isa = isa or chosen_isa()
    root = Path(os.environ.get("EXPLORER_KERNEL_CACHE", Path.home() / ".cache" / "decoding-explorer" / "rowinv"))
    sources = SOURCE.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    flags = " ".join(COMMON + compile_flags(isa) + thread_flags())
    key = hashlib.sha1(sources + torch.__version__.encode() + " ".join(sorted(_cpu_flags())).encode()
                       + platform.machine().encode() + flags.encode()).hexdigest()[:12]
    return root / f"{isa}-{key}"


def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise KernelUnavailable(f"no C++ compiler ({cxx}) to build the row-invariant kernel")
    return cxx


def load() -> ModuleType:
    """The compiled module of the chosen path (``linear``, ``attend``, ``path``, ...); KernelUnavailable with one
    line if it cannot be had."""
    return _load(os.environ.get(ENV, ""))  # called per layer of a pass: one dict look-up, then the cached module


@functools.cache
def _load(forced: str) -> ModuleType:
    isa = chosen_isa()
    if platform.machine() not in X86 + ARM:
        raise KernelUnavailable(f"no row-invariant kernel for a {platform.machine()} CPU")
    _compiler()
    from torch.utils.cpp_extension import load as load_extension  # deferred: setuptools via torch.utils.cpp_extension

    out = build_dir(isa)
    out.mkdir(parents=True, exist_ok=True)
    try:
        return load_extension(name=f"rowinv_{out.name.replace('-', '_')}", sources=[str(SOURCE)],
                              extra_cflags=COMMON + compile_flags(isa) + thread_flags(),
                              extra_ldflags=thread_flags(), build_directory=str(out), verbose=False)
    except (RuntimeError, OSError, ImportError) as exc:
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise KernelUnavailable(f"building the row-invariant kernel ({isa}) failed ({first})") from None


def use_amx() -> bool:
    """Whether int8 weights go to the AMX tiles (same integers as the other paths, faster for several rows): the amx
    path, granted by the OS, and not turned off with EXPLORER_NO_AMX=1."""
    return os.environ.get("EXPLORER_NO_AMX", "") in ("", "0") and bool(load().has_amx())


def available() -> bool:
    try:
        load()
    except KernelUnavailable:
        return False
    return True


def describe() -> str:
    """One line: the path in use and how it was chosen (for the page's model line and ``--verbose``)."""
    try:
        isa = chosen_isa()
    except KernelUnavailable as exc:
        return str(exc)
    how = f"forced by {ENV}" if os.environ.get(ENV) else "the best this CPU has"
    return f"kernel path {isa} ({how})"


# ---- the kernels without torch (rowinv_check.cpp): each path's bits in seconds, and the aarch64 path under qemu

def check_binary(isa: str, cross: bool = False) -> Path:
    """Compile rowinv_check.cpp for a path (``cross``: for aarch64 with aarch64-linux-gnu-g++) into the kernel cache;
    reused while the sources are unchanged. KernelUnavailable if no compiler."""
    cxx = "aarch64-linux-gnu-g++" if cross else _compiler()
    if shutil.which(cxx) is None:
        raise KernelUnavailable(f"no {cxx} to build the {isa} check")
    flags = COMMON + compile_flags(isa, cross)
    if cross:
        flags = flags + ["-static"]
    sources = CHECK_SOURCE.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    key = hashlib.sha1(sources + " ".join(flags).encode() + cxx.encode()).hexdigest()[:12]
    root = Path(os.environ.get("EXPLORER_KERNEL_CACHE", Path.home() / ".cache" / "decoding-explorer" / "rowinv"))
    exe = root / "check" / f"{isa}{'-aarch64' if cross else ''}-{key}"
    if not exe.exists():
        exe.parent.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_suffix(f".tmp{os.getpid()}")
        proc = subprocess.run([cxx, *flags, "-I", str(HERE), str(CHECK_SOURCE), "-o", str(tmp)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise KernelUnavailable(f"building the {isa} check failed: {proc.stderr.strip().splitlines()[:1]}")
        tmp.rename(exe)
    return exe


def check_path(isa: str, cross: bool = False, *args: str) -> subprocess.CompletedProcess:
    """Run a path's check (rowinv_check.cpp): its stdout lists a digest of each kernel's outputs, its exit code is
    non-zero when a row of a many-row call differs from the one-row call."""
    exe = check_binary(isa, cross)
    cmd = ([shutil.which("qemu-aarch64") or "qemu-aarch64-static"] if cross else []) + [str(exe), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)
