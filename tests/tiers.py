"""Which tests run where, as rules over the test files' source (read with ast, nothing run):

- the torch_api selection, `-m torch_api`, for a quick check of another torch version: the
  tests that reach one of torch's moving parts (below), found in each test's own code, the
  fixtures it asks for and the functions of its file it calls, so a test added tomorrow is
  in it, or not, by the same rule (tests/conftest.py marks them at collection);
- the modules of gpt/ the fast tier imports (tests/project/test_tiers.py checks it reaches all).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# What changes between torch versions under this package, each with what broke or moved:
# torch.distributed, DTensor, FSDP2 and gloo (FSDP2 on a CPU: broken before 2.9, gloo's
# reduce-scatter summing for a mean in 2.7-2.8, state_dict helpers caching models in 2.7);
# torch.multiprocessing and fake process groups; torch.compile / dynamo (graph breaks and
# recompiles move with every release); torch.optim.Muon (2.9); torchao's float8, built for
# given torch versions; flex attention; custom ops; activation checkpointing; and the
# package's modules that wrap them.
TORCH_API_MODULES = (
    "torch.distributed", "torch.multiprocessing", "torch._dynamo", "torch.testing._internal",
    "torch.optim._muon", "torchao", "torch.nn.attention.flex_attention", "torch.utils.checkpoint",
    "gpt.engine.parallel", "gpt.core.compat", "gpt.model.fp8", "gpt.optim.muon", "gpt.engine.recompute",
    "gpt.model.attention", "gpt.model.attention_mask", "gpt.model.chunked_ce", "gpt.model.loss_kernels",
)
# The tests' own helpers and shared fixtures that drive those parts.
TORCH_API_NAMES = (
    "run_torchrun", "torchrun_cmd", "assert_two_ranks_match_one", "assert_resume_is_exact",
    "graph_backend", "fake_world", "compile", "spawn",
)
# The trainer's flags that reach them in a subprocess (run_cli, main([...])), and the
# launchers, which start torchrun.
TORCH_API_FLAGS = ("--parallel", "--compile", "--fp8", "--activation-checkpointing",
                   "--optimizer", "--attn-window", "--doc-mask", "--resume")
LAUNCHERS = ("torchrun", "single_node.sh", "multi_node.sh")


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it was imported as, for every import in the file."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


@cache
def _file(path: Path) -> tuple[dict[str, ast.FunctionDef], dict[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    return functions, _imports(tree)


def _hit(name: str, imports: dict[str, str]) -> str | None:
    """`name` (dotted, as the code spells it) resolved through the file's imports, where it
    is one of torch's moving parts or a helper that drives them."""
    head, _, rest = name.partition(".")
    full = imports.get(head, head) + (f".{rest}" if rest else "")
    if head in imports and any(full == m or full.startswith(m + ".") for m in TORCH_API_MODULES):
        return full
    last = full.rsplit(".", 1)[-1]
    if last in ("compile", "spawn"):  # torch.compile, torch.multiprocessing.spawn
        return full if full.startswith("torch.") else None
    return full if last in TORCH_API_NAMES else None


@cache
def _direct(path: Path, function: str) -> tuple[str | None, frozenset[str]]:
    """(what in `function`'s own code is in the selection's rule, or None; the names of
    its file's functions and fixtures it uses)."""
    functions, imports = _file(path)
    fn = functions[function]
    names = {a.arg for a in fn.args.args}  # the fixtures it asks for
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and (
                sub.value in TORCH_API_FLAGS or any(w in sub.value for w in LAUNCHERS)):
            return sub.value, frozenset()
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute) and (dotted := _dotted(sub)):
            names.add(dotted)
    for name in sorted(names):
        if hit := _hit(name, imports):
            return hit, frozenset()
    return None, frozenset(n for n in names if n in functions and n != function)


@cache
def torch_api(path: Path, function: str) -> str | None:
    """Why the test `function` of the file `path` is in the torch_api selection (what it
    uses, itself or through a function or fixture of its file), or None."""
    functions, _ = _file(path)
    if function not in functions:
        return None
    seen, todo = set(), [function]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        hit, uses = _direct(path, name)
        if hit:
            return hit
        todo.extend(uses)
    return None


# ---------------------------------------------------------------------------------------
# the fast tier and the package's modules


def _slow(node: ast.FunctionDef, module_marks: str) -> bool:
    marks = module_marks + " ".join(ast.unparse(d) for d in node.decorator_list)
    return "mark.slow" in marks


def _gpt_names(node: ast.AST, imports: dict[str, str], scripts: dict[str, str]) -> set[str]:
    """The gpt modules `node` names: imports in it, `-m gpt.x` targets and strings naming a
    module, the scripts it runs (train_gpt2.py, fineweb.py), the helpers that run them."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import):
            out.update(a.name for a in sub.names)
        elif isinstance(sub, ast.ImportFrom) and sub.module:
            out.update({sub.module, *(f"{sub.module}.{a.name}" for a in sub.names)})
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            if sub.value.startswith("gpt."):
                out.add(sub.value)
            out.update(m for script, m in scripts.items() if sub.value.endswith(script))
        elif isinstance(sub, ast.Name) and sub.id in ("run_cli", "TRAIN_SCRIPT", "run_torchrun"):
            out.add(scripts["train_gpt2.py"])
    return {m for m in out if m == "gpt" or m.startswith("gpt.")}


def fast_tier_modules(known: set[str], scripts: dict[str, str]) -> set[str]:
    """The gpt modules (of `known`) the fast tier's tests name: a file's top-level imports
    where one of its tests is fast, and what each fast test names itself."""
    out: set[str] = set()
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_marks = " ".join(ast.unparse(n) for n in tree.body if isinstance(n, ast.Assign)
                                and any(getattr(t, "id", "") == "pytestmark" for t in n.targets))
        tests = [n for n in tree.body if isinstance(n, ast.FunctionDef)
                 and n.name.startswith("test")]
        fast = [n for n in tests if not _slow(n, module_marks)]
        if not fast:
            continue
        imports = _imports(tree)
        top = ast.Module(body=[n for n in tree.body if not isinstance(n, ast.FunctionDef)],
                         type_ignores=[])
        helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef)
                   and not n.name.startswith("test")]  # fixtures and helpers of the file
        for node in (top, *fast, *helpers):
            out |= _gpt_names(node, imports, scripts)
    return {m for m in out if m in known}
