"""What model families add to the decoders, by registration: drafters built on a model of their own kind, and
diffusion samplers for diffusion models that decode their own way.

A family registers in its folder's ``__init__.py`` (explorer/families/<family>/), so ``make_drafter`` and
``decode_diffusion`` look here and name no family; ``explorer.families`` imports every family, and
``explorer.models`` imports ``explorer.families`` before it loads a preset.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from explorer.decoding.config import DecodeConfig
    from explorer.decoding.draft import Drafter
    from explorer.runtime import Models


@dataclass(frozen=True)
class FamilyDrafter:
    """A family's drafter. ``serves(models, cfg)``: it is the one ``cfg.drafter`` asks for on this bundle (checked
    in registration order, before the core's own drafters); ``offers_assistant(models)``: the bundle can run
    drafter "assistant" with it; ``make(models)`` builds it (ExplorerError with one line when it cannot);
    ``make_tree(models)``, where the drafter can branch, builds its token-tree drafter (a ``TreeDrafter``)."""

    family: str
    serves: Callable[[Models, DecodeConfig], bool]
    offers_assistant: Callable[[Models], bool]
    make: Callable[[Models], Drafter]
    make_tree: Callable[[Models], Any] | None = None


@dataclass(frozen=True)
class DiffusionSampler:
    """A family's own diffusion decoder, used when ``applies(models.diffusion)``; same signature as
    ``decode_diffusion``."""

    family: str
    applies: Callable[[Any], bool]
    decode: Callable[..., Generator]


FAMILY_DRAFTERS: list[FamilyDrafter] = []
DIFFUSION_SAMPLERS: list[DiffusionSampler] = []


def register_drafter(drafter: FamilyDrafter) -> None:
    if all(d.family != drafter.family for d in FAMILY_DRAFTERS):
        FAMILY_DRAFTERS.append(drafter)


def register_diffusion_sampler(sampler: DiffusionSampler) -> None:
    if all(s.family != sampler.family for s in DIFFUSION_SAMPLERS):
        DIFFUSION_SAMPLERS.append(sampler)


def family_drafter(models: Models, cfg: DecodeConfig) -> FamilyDrafter | None:
    return next((d for d in FAMILY_DRAFTERS if d.serves(models, cfg)), None)


def offers_assistant(models: Models) -> bool:
    return any(d.offers_assistant(models) for d in FAMILY_DRAFTERS)


def diffusion_sampler(model: Any) -> DiffusionSampler | None:
    return next((s for s in DIFFUSION_SAMPLERS if s.applies(model)), None)
