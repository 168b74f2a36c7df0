"""The ``eagle`` family: an EAGLE head that drafts from the target's features (``head.py``; its files and its start
from the target: ``files.py``; its token trees: ``tree.py``), any Llama target."""

from explorer.decoding.registry import FamilyDrafter, register_drafter
from explorer.families.eagle.files import build_eagle_head, load_eagle_head, save_eagle_head
from explorer.families.eagle.head import EagleHead, FeatureDrafter, is_eagle, make_feature_drafter, rope_tables
from explorer.families.eagle.tree import EagleTreeDrafter, make_eagle_tree_drafter

register_drafter(FamilyDrafter(
    family="eagle", serves=lambda models, cfg: cfg.drafter == "assistant" and is_eagle(models.assistant),
    offers_assistant=lambda models: is_eagle(models.assistant), make=make_feature_drafter,
    make_tree=make_eagle_tree_drafter))

__all__ = ["EagleHead", "EagleTreeDrafter", "FeatureDrafter", "build_eagle_head", "is_eagle", "load_eagle_head",
           "make_feature_drafter", "rope_tables", "save_eagle_head"]
