"""Decoding explorer: speculative and masked-diffusion decoding, side by side, measured.

Public API (the contract: docs/design.md, section 3)::

    import explorer
    models = explorer.load_models("tiny")
    trace = explorer.decode("speculative", models, "def parse(line):", max_new_tokens=64, gamma=4)
"""

from explorer.decoding.api import decode, stream
from explorer.decoding.events import Trace
from explorer.errors import ExplorerError
from explorer.models import PRESETS, load_models
from explorer.runtime import Models

__all__ = ["decode", "stream", "load_models", "Trace", "Models", "PRESETS", "ExplorerError"]
