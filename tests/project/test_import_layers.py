"""The code's layout stays a place a newcomer can find their way in: folders in layers (a
module imports only its own folder or the folders beneath it, as docs/MAP.md lists them),
no import circle of any kind between the package's modules (imports inside functions and
under TYPE_CHECKING count too: a reader has to hold every circle in their head), a short
list of commands at gpt/'s top and of files at gpt/bench/'s, no source file over 400
lines, the benchmarks never imported by the trainer, and every module of gpt/ on the
"where is X" map (docs/MAP.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "gpt"
MAX_LINES = 400
MAX_TOP_MODULES = 10  # gpt/*.py: the commands a user runs (and the package's __init__)
MAX_BENCH_TOP = 12  # gpt/bench/*.py: its command line and the parts its subfolders share
MAP = REPO / "docs" / "MAP.md"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `path` imports, wherever the import stands. `from pkg
    import sub` names the submodule, not the package; a package's own __init__ is not an
    edge from its submodules (Python runs it first in any case)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names} & known
            out.update(subs or {base})
    return {m for m in out if m in known and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imported_modules(name, path, set(mods)) for name, path in mods.items()}


def test_the_package_has_no_import_circle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_circle_finder_sees_type_only_and_function_level_imports(tmp_path: Path) -> None:
    # the check above must be able to fail: a TYPE_CHECKING import back is a circle
    a = tmp_path / "a.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpt.b import X\n")
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from gpt.a import Y\n")
    known = {"gpt.a", "gpt.b"}
    graph = {name: imported_modules(name, path, known)
             for name, path in (("gpt.a", a), ("gpt.b", b))}
    assert find_cycle(graph) == ["gpt.a", "gpt.b", "gpt.a"]


def test_no_source_file_is_over_400_lines() -> None:
    files = [*PACKAGE.rglob("*.py"), REPO / "train_gpt2.py", REPO / "fineweb.py"]
    long = {str(p.relative_to(REPO)): n for p in files
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split along a concept): {long}"


def test_the_map_names_every_module_and_only_files_that_exist() -> None:
    text = MAP.read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:gpt|tests|benchmarks|configs|launch)/[^`\s]*)`", text))
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert not missing, f"docs/MAP.md names files that do not exist: {missing}"
    modules_ = {str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")}
    off = sorted(modules_ - named)
    assert not off, f"modules of gpt/ missing from docs/MAP.md (add a row for each): {off}"


# ---------------------------------------------------------------------------------------
# layers


def layers() -> list[str]:
    """The folders of gpt/ in docs/MAP.md's "Layers" list, lowest first."""
    text = MAP.read_text(encoding="utf-8").split("## Layers", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `gpt/(\w+)/`", text, re.M)


def folder_of(module: str) -> str | None:
    """The layer folder a module belongs to; None for the commands at gpt/'s top and
    the benchmark suite, which stand above every layer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in layers()) else None


def upward_imports(graph: dict[str, set[str]], order: list[str]) -> list[str]:
    """Every import from a layer's module into a module of a higher layer, or into a
    command or the benchmark suite (which stand above them all)."""
    rank = {name: i for i, name in enumerate(order)}
    out = []
    for module, targets in graph.items():
        here = folder_of(module)
        if here is None or here == "bench":
            continue
        for target in targets:
            there = folder_of(target)
            if there is None or there == "bench" or rank[there] > rank[here]:
                out.append(f"{module} -> {target}")
    return sorted(out)


def test_the_layers_are_the_folders_of_gpt() -> None:
    order = layers()
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} - {"bench"}
    assert len(order) >= 6 and len(set(order)) == len(order)
    assert set(order) == folders, f"docs/MAP.md's layers {order} are not gpt/'s folders {folders}"


def test_no_module_imports_a_higher_layer() -> None:
    up = upward_imports(import_graph(), layers())
    assert not up, "imports from a lower folder to a higher one (docs/MAP.md, Layers): " + "; ".join(up)


def test_the_layer_check_sees_an_import_upward() -> None:
    # the check above must be able to fail: a model module importing the training loop
    graph = {"gpt.model.transformer": {"gpt.train.loop"}, "gpt.train.loop": {"gpt.model.transformer"},
             "gpt.model.sizing": {"gpt.plot"}}
    assert upward_imports(graph, layers()) == ["gpt.model.sizing -> gpt.plot",
                                               "gpt.model.transformer -> gpt.train.loop"]


def test_nothing_outside_the_benchmarks_imports_them() -> None:
    users = sorted(f"{m} -> {t}" for m, targets in import_graph().items()
                   if not m.startswith("gpt.bench") for t in targets if t.startswith("gpt.bench"))
    assert not users, f"the package imports its benchmarks: {users}"


def test_gpt_and_its_benchmarks_keep_a_short_top() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at gpt/'s top: {top}"
    bench = sorted(p.name for p in (PACKAGE / "bench").glob("*.py"))
    assert len(bench) <= MAX_BENCH_TOP, f"{len(bench)} modules at gpt/bench/'s top: {bench}"
