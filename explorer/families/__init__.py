"""Model families, one folder each: what a family adds (its loader, its drafter, its diffusion sampler) it
registers in its folder's ``__init__.py`` (explorer/runtime.py ``register_loader``, explorer/decoding/registry.py).
Adding a family is a folder and one name on the line below (docs/design.md, "Adding a model family")."""

from explorer.families import eagle, gemma, random_tiny, smollm2, tiny  # noqa: F401  (each registers itself)
