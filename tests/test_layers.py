"""The package's shape: layers import only downward, no module imports itself back through a
cycle, loading/ builds nothing, no model family imports another, no module reads another
layer's internals (its private names, or the attributes of a layer it may not import), and
the package imports with only its base dependencies."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np

PACKAGE = Path(__file__).resolve().parents[1] / "exactdraft"

# Lower ranks never import higher ones. Modules of equal rank may import each other (inside a
# layer), cycles aside.
RANKS = {
    "errors": 0,
    "float64_math": 1, "progress": 1, "arguments": 1, "key_files": 1,
    "formats": 2,
    "kernels": 3,
    "backends": 4,
    "models": 5,
    "loading": 5,
    "parallel": 5.5,  # a Target over ranks: models on a gathering backend
    "sampling": 6, "prompts": 6, "stops": 6, "pretrained": 6,
    "guard": 7, "verify": 7, "drafters": 7, "constraints": 7, "results": 7,
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
    """exactdraft modules imported anywhere in the file: at the top, inside functions (lazy
    imports) and in TYPE_CHECKING blocks alike, since a type-only import still ties the two
    modules together and hides a circle from the interpreter only."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
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
        "exactdraft.models.families.llama"}
    assert violations(edges) == ["exactdraft.kernels.cpu -> exactdraft.models.decoder",
                                 "exactdraft.loading.gguf -> exactdraft.models.families.llama"]
    table, dequantize = "exactdraft.formats.table", "exactdraft.formats.dequantize"
    edges[table] = edges[table] | {dequantize}
    edges[dequantize] = edges[dequantize] | {table}
    assert any(f"{dequantize} -> {table}" in c for c in cycles(edges))


def test_a_type_only_circle_of_one_rank_is_found(tmp_path):
    """Negative control: the engine importing the Generator for a type annotation alone (both
    modules have one rank, and the import sits in a TYPE_CHECKING block) closes a circle with
    the Generator's own import of the engine, and the check reports it."""
    source = tmp_path / "scheduler.py"
    source.write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                      "    from exactdraft.generator import Generator\n")
    assert imports_of(source) == {"exactdraft.generator"}
    edges = graph()
    assert RANKS[layer("exactdraft.generator")] == RANKS[layer("exactdraft.engine.scheduler")]
    edges["exactdraft.engine.scheduler"] |= imports_of(source)
    assert any(c.startswith("exactdraft.engine.scheduler -> exactdraft.generator") or
               "exactdraft.generator -> exactdraft.engine.scheduler" in c for c in cycles(edges))


# -- model families ------------------------------------------------------------------------------

def family_modules(edges: dict[str, set[str]]) -> set[str]:
    """The modules of exactdraft.models that define a model family (a top-level FAMILY)."""
    found = set()
    for name in edges:
        if not name.startswith("exactdraft.models."):
            continue
        tree = ast.parse(module_path(name).read_text())
        if any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FAMILY"
                                                     for t in node.targets)
               for node in tree.body):
            found.add(name)
    return found


def module_path(name: str) -> Path:
    path = PACKAGE.parent / (name.replace(".", "/") + ".py")
    return path if path.is_file() else PACKAGE.parent / name.replace(".", "/") / "__init__.py"


def family_imports(edges: dict[str, set[str]], families: set[str]) -> list[str]:
    return sorted(f"{module} -> {target}" for module in families
                  for target in edges[module] & families)


def test_no_family_imports_another_family():
    edges = graph()
    families = family_modules(edges)
    assert {f"exactdraft.models.families.{name}" for name in
            ("llama", "gemma3", "qwen3_moe", "qwen3_next", "nemotron_h")} <= families
    wrong = family_imports(edges, families)
    assert not wrong, "family modules importing each other:\n" + "\n".join(wrong)


def test_the_family_check_can_fail():
    """Negative control: a family borrowing a helper from a sibling is reported."""
    edges = graph()
    families = family_modules(edges)
    edges["exactdraft.models.families.gemma3"] = edges["exactdraft.models.families.gemma3"] | {
        "exactdraft.models.families.llama"}
    assert family_imports(edges, families) == [
        "exactdraft.models.families.gemma3 -> exactdraft.models.families.llama"]


# -- reads of another layer's internals ----------------------------------------------------------

# Names every Python object, container, string or numpy array has: reading them says nothing
# about which layer an object comes from.
COMMON_NAMES = set().union(*(dir(kind) for kind in (object, list, dict, set, tuple, str, bytes,
                                                     int, float, memoryview, Path, np.ndarray,
                                                     np.dtype)))


def class_attributes(tree: ast.AST) -> set[str]:
    """Attribute names a module defines: class members and fields, and every `x.name = ...`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def internal_reads(sources: dict[str, str]) -> list[str]:
    """Reads of another layer's internals, statically: (1) a private name (`_x`) imported from
    a module of another layer, or read as an attribute of anything but self or cls when the
    reading module does not define it; (2) an attribute that only a layer the reader may not
    import (APART) defines, such as a loader's fields read by a model. Names every object has
    (COMMON_NAMES) are not counted."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    defined = {name: class_attributes(tree) for name, tree in trees.items()}
    by_layer: dict[str, set[str]] = {}
    for name, names in defined.items():
        by_layer.setdefault(layer(name), set()).update(names)
    wrong = []
    for name, tree in trees.items():
        own = layer(name)
        if own == "__init__":
            continue
        allowed = set().union(*(names for other, names in by_layer.items()
                                if RANKS[other] <= RANKS[own] and (own, other) not in APART))
        apart = set().union(*(names for other, names in by_layer.items()
                              if (own, other) in APART)) - allowed - COMMON_NAMES
        for node in ast.walk(tree):
            # (The package root's private names are its compiled extensions, each the
            # native half of one module.)
            if isinstance(node, ast.ImportFrom) and node.module in sources \
                    and layer(node.module) not in (own, "__init__"):
                wrong += [f"{name}:{node.lineno} imports {node.module}.{alias.name}"
                          for alias in node.names if is_private(alias.name)]
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            mine = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            # The standard library's underscore names (os._exit) are its public interface.
            standard = isinstance(node.value, ast.Name) and \
                node.value.id in sys.stdlib_module_names
            if is_private(node.attr) and not (mine or standard) and \
                    node.attr not in defined[name]:
                wrong.append(f"{name}:{node.lineno} reads {ast.unparse(node)}")
            elif node.attr in apart:
                wrong.append(f"{name}:{node.lineno} reads {ast.unparse(node)}, which only a "
                             "layer it may not import defines")
    return sorted(wrong)


def package_sources() -> dict[str, str]:
    return {module_name(path): path.read_text() for path in PACKAGE.rglob("*.py")}


# Reads still to be removed, as (module, private name read); an entry goes once its module no
# longer has it.
KNOWN_INTERNAL_READS = {("exactdraft.backends.torch_cuda", "_matmul_kernel")}


def known(line: str) -> bool:
    return any(line.startswith(module + ":") and line.endswith("." + name)
               for module, name in KNOWN_INTERNAL_READS)


def test_no_module_reads_another_layers_internals():
    wrong = [line for line in internal_reads(package_sources()) if not known(line)]
    assert not wrong, "reads of another layer's internals:\n" + "\n".join(wrong)


def test_the_internals_check_can_fail():
    """Negative controls: a model reading the GGUF loader's keep_quantized (the side door the
    check was written for), a private name imported across layers, and a private attribute of
    another object are all reported; reading one's own private attributes is not."""
    sources = package_sources()
    sources["exactdraft.models.moe"] += (
        "\n\ndef _side_door(tensors):\n    return tensors.keep_quantized\n")
    sources["exactdraft.models.cache"] += (
        "\n\nfrom exactdraft.formats import _private_helper\n")
    sources["exactdraft.models.state"] += (
        "\n\ndef _peek(cache):\n    return cache._hidden_rows\n")
    sources["exactdraft.models.token_tree"] += (
        "\n\nclass _Own:\n    def own_private_value(self):\n        return self._mine\n")
    found = set(internal_reads(sources)) - set(internal_reads(package_sources()))
    assert len(found) == 3, found
    assert any("models.moe" in line and "tensors.keep_quantized" in line for line in found)
    assert any("imports exactdraft.formats._private_helper" in line for line in found)
    assert any("reads cache._hidden_rows" in line for line in found)


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
