"""The package's shape: layers import only downward, no module imports itself back through a
cycle, loading/ builds nothing, and the package imports with only its base dependencies."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "exactdraft"

# Lower ranks never import higher ones. Modules of equal rank may import each other (inside a
# layer), cycles aside.
RANKS = {
    "errors": 0,
    "dequantize": 1, "float64_math": 1, "progress": 1, "arguments": 1,
    "formats": 2,
    "kernels": 3,
    "backends": 4,
    "models": 5,
    "loading": 5,
    "sampling": 6, "sampling_native": 6, "prompts": 6, "stops": 6, "pretrained": 6,
    "constraints": 6, "constraint_tokens": 6, "tool_calls": 6, "tool_readers": 6,
    "guard": 7, "depth": 7, "verify": 7, "drafters": 7, "drafting": 7, "constrained": 7,
    "results": 7,
    "generator": 8, "decoding": 8, "scoring": 8,
    "engine": 8,  # the Generator runs a list of prompts through the Engine
    "server": 8.75,
    "check": 9, "training": 9,
    "testing": 10,
    "__init__": 10.5,  # the public names, for the command line
    "cli": 11,
    "__main__": 12,
}
# Layers that may not import each other although neither is above the other.
APART = {("loading", "models"), ("models", "loading"), ("loading", "backends"),
         ("loading", "kernels")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """exactdraft modules imported anywhere in the file, TYPE_CHECKING blocks excluded."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("exactdraft"))
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("exactdraft"):
            if node.module != "exactdraft":  # the root itself: only `from exactdraft import x`
                found.add(node.module)
            for alias in node.names:  # `from exactdraft import sampling_native`
                candidate = f"{node.module}.{alias.name}"
                if (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).is_file():
                    found.add(candidate)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {i for i in imports_of(path) if i in modules and i != name}
            for name, path in modules.items()}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def violations(edges: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, imported in edges.items():
        if layer(module) == "__init__":
            continue
        for target in imported:
            own, other = RANKS[layer(module)], RANKS[layer(target)]
            if other > own or (layer(module), layer(target)) in APART:
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def cycles(edges: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    found = []

    def walk(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                found.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in state:
                walk(target, trail + [target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node, [node])
    return found


def test_layers_import_only_downward():
    wrong = violations(graph())
    assert not wrong, "imports that run up or across the layers:\n" + "\n".join(wrong)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(found)


def test_every_package_module_has_a_layer():
    assert {layer(m) for m in graph()} <= set(RANKS)


def test_the_checks_can_fail():
    """Negative controls: an import from kernels up to models, one from loading across to
    models, and a two-module cycle are all reported."""
    edges = graph()
    edges["exactdraft.kernels.cpu"] = edges["exactdraft.kernels.cpu"] | {
        "exactdraft.models.decoder"}
    edges["exactdraft.loading.gguf"] = edges["exactdraft.loading.gguf"] | {
        "exactdraft.models.llama"}
    assert violations(edges) == ["exactdraft.kernels.cpu -> exactdraft.models.decoder",
                                 "exactdraft.loading.gguf -> exactdraft.models.llama"]
    edges["exactdraft.formats"] = edges["exactdraft.formats"] | {"exactdraft.dequantize"}
    edges["exactdraft.dequantize"] = edges["exactdraft.dequantize"] | {"exactdraft.formats"}
    assert any("exactdraft.dequantize -> exactdraft.formats" in c for c in cycles(edges))


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "mlx", "triton", "transformers", "gguf", "fastapi",
                                  "starlette", "uvicorn"}:
            raise ImportError(f"blocked {name}")
sys.meta_path.insert(0, Block())
import exactdraft, exactdraft.pretrained, exactdraft.testing, exactdraft.cli, exactdraft.check
print("imported")
"""


def test_the_package_imports_with_only_its_base_dependencies():
    result = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr
