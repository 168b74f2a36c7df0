"""The layers of docs/design.md: a module imports only from its own layer or the layers below it."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "explorer"

# Lowest first. A module's layer is the first entry whose name is a prefix of its dotted name.
LAYERS = [
    ("core", ["errors", "config", "sampling", "events"]),
    ("models", ["models", "diffusion_adapter", "trimmed_draft", "eagle", "gemma"]),
    ("decoding", ["drafters", "autoregressive", "speculative", "diffusion"]),
    ("api", ["api", "__init__", "flags"]),
    ("measure and views", ["metrics", "workload", "report", "bench", "audit", "render", "plots"]),
    ("app", ["ui", "loadtest", "hosting"]),
    ("entry points", ["cli", "__main__", "train", "training"]),
]
# Known upward imports, each made inside a function: a model family's own drafter returns a drafters.Draft.
ALLOWED = {("eagle", "drafters"), ("gemma", "drafters")}


def layer_of(module: str) -> int:
    for rank, (_, names) in enumerate(LAYERS):
        if module.split(".")[0] in names:
            return rank
    raise AssertionError(f"explorer.{module} is in no layer of docs/design.md")


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("explorer"):
            if node.module == "explorer":
                found.update(alias.name for alias in node.names)
            else:
                found.add(node.module.removeprefix("explorer."))
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("explorer.") for a in node.names if a.name.startswith("explorer."))
    return found


def test_every_import_points_down_the_layers():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for imported in imports_of(path):
            if imported in ("explorer", "") or (module.split(".")[0], imported.split(".")[0]) in ALLOWED:
                continue
            if layer_of(imported) > layer_of(module):
                wrong.append(f"explorer.{module} ({LAYERS[layer_of(module)][0]}) imports explorer.{imported} "
                             f"({LAYERS[layer_of(imported)][0]})")
    assert not wrong, "\n".join(wrong)


def test_the_decoding_layers_know_nothing_of_the_views():
    """Decoders, models and the API import no UI, plotting or table library."""
    for path in sorted(ROOT.glob("*.py")):
        module = path.stem
        if layer_of(module) <= layer_of("api"):
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
            names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert not names & {"gradio", "plotly", "pandas"}, module
