"""The layers of docs/design.md: a module imports only from its own layer or the layers below it."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "explorer"

# Lowest first. A module belongs to the entry that names it or, failing that, its folder (the longest match).
LAYERS = [
    ("core", ["errors", "runtime", "compact_weights", "decoding.config", "decoding.sampling", "decoding.events",
              "decoding.draft", "decoding.registry", "decoding.acceptance", "decoding.unmasking"]),
    ("decoding", ["decoding"]),
    ("families", ["families"]),
    ("models", ["models", "precision"]),
    ("api", ["decoding.api", "flags", "__init__"]),
    ("measure and views", ["measure", "app.render", "app.headers", "app.tree_view", "app.byte_chips",
                           "app.diffusion_view",
                           "app.plots", "engine"]),
    ("app", ["app", "measure.loadtest"]),
    ("entry points", ["cli", "__main__", "train", "training", "engine.commands"]),
]
# Known upward imports: none (a family's drafter returns a decoding.draft.Draft, a core type; the decoders find the
# families' drafters and samplers through decoding.registry).
ALLOWED: set[tuple[str, str]] = set()


def layer_of(module: str) -> int:
    best = None
    for rank, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (rank, name)
    assert best is not None, f"explorer.{module} is in no layer of docs/design.md"
    return best[0]


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__") if name != "__init__" else name


MODULES = {module_name(p) for p in ROOT.rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "explorer":
            base = node.module.removeprefix("explorer").removeprefix(".")
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                found.add(sub if sub in MODULES else base or "__init__")
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("explorer.") for a in node.names if a.name.startswith("explorer."))
    return found


def test_every_import_points_down_the_layers():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        module = module_name(path)
        for imported in imports_of(path):
            if imported == "__init__" or (module, imported) in ALLOWED:
                continue
            if layer_of(imported) > layer_of(module):
                wrong.append(f"explorer.{module} ({LAYERS[layer_of(module)][0]}) imports explorer.{imported} "
                             f"({LAYERS[layer_of(imported)][0]})")
    assert not wrong, "\n".join(wrong)


def test_the_decoding_layers_know_nothing_of_the_views():
    """Decoders, models and the API import no UI, plotting or table library."""
    for path in sorted(ROOT.rglob("*.py")):
        module = module_name(path)
        if layer_of(module) <= layer_of("decoding.api"):
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
            names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert not names & {"gradio", "plotly", "pandas"}, module
