"""The ``tiny`` family: embedded models trained on Python code (``load.py``)."""

from explorer.families.tiny.load import TINY_DIR, load_tiny, load_tiny_diffusion
from explorer.runtime import register_loader

register_loader("local", load_tiny)

__all__ = ["TINY_DIR", "load_tiny", "load_tiny_diffusion"]
