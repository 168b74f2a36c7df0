"""Command-line flags made from the decoding options: one flag per ``config.DecodeConfig`` field.

Used by the CLI (``decode``, ``audit``) and the bench, so a new option needs one field, one
``config.OPTION_HELP`` line, and nothing else to appear everywhere with the same name and help.
"""

from __future__ import annotations

import argparse
import re

from explorer.decoding.config import OPTION_HELP, DecodeConfig, option_type
from explorer.models import DEFAULT_PRESET
from explorer.precision import PRECISIONS


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--preset, --device, --dtype, --precision: which models ``explorer.load_models`` loads, and where."""
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"model bundle (default: {DEFAULT_PRESET}; see README)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the preset's)")
    p.add_argument("--precision", default=None,
                   help=f"the target's weights and kernels: {', '.join(PRECISIONS)} (float32 is torch's; the others "
                        "keep greedy speculative == autoregressive; default: the preset's)")


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def option_help(name: str, default: object = None) -> str:
    """OPTION_HELP[name] with its default: ``default`` when given, else the dataclass default."""
    text = OPTION_HELP[name]
    if default is not None:
        return re.sub(r" \(default: [^)]*\)$", "", text) + f" (default: {default})"
    shown = getattr(DecodeConfig, name)
    if "default:" in text or shown is None or isinstance(shown, bool):
        return text
    return f"{text} (default: {shown})"


def add_option_arguments(p: argparse.ArgumentParser, names: list[str], defaults: bool = False,
                         hidden: bool = False) -> None:
    """One flag per DecodeConfig field in ``names``, typed from its annotation, with OPTION_HELP as help.

    Each flag's default is None (the decoder's own default applies, and the help says which), or with
    ``defaults`` the dataclass default (where the caller needs a value, as the bench does). ``hidden``
    flags are accepted but left out of --help (a command that takes them and does not use them)."""
    for name in names:
        default = getattr(DecodeConfig, name) if defaults else None
        base = option_type(name)
        if base is bool:
            p.add_argument(option_flag(name), action="store_true", default=None,
                           help=argparse.SUPPRESS if hidden else option_help(name))
            continue
        p.add_argument(option_flag(name), type=None if base is str else base, default=default,
                       help=argparse.SUPPRESS if hidden else option_help(name, default))
