"""The ``smollm2-135m`` family: the GGUF target (``load.py``), its trimmed-head draft (``trimmed_draft.py``) and its
masked-diffusion LoRA adapter (``diffusion_adapter.py``); its EAGLE head is the ``eagle`` family's."""

from explorer.families.smollm2.load import SMOLLM2_DIR, SMOLLM2_HUB_ID, load_smollm2, smollm2_gguf_path
from explorer.runtime import register_loader

register_loader("gguf", load_smollm2)

__all__ = ["SMOLLM2_DIR", "SMOLLM2_HUB_ID", "load_smollm2", "smollm2_gguf_path"]
