"""Every place the project names one of its own files or modules in text (the docs, the
benchmarks' write-ups and scripts, the configs, the code's comments, docstrings and
messages, the tests) names one that exists. A move of a module rewrites its imports, which
the tests then run; a path in a sentence or a dotted name in a docstring is checked by
nothing else, and a reader who follows it finds nothing.

Not checked: the records of past runs (benchmarks/gpu/<date>-<device>/, the JSON, logs and
patches measurements left behind), which name the files as they were when they ran; this
file and the examples' placeholders (`gpt.x`, the layout test's made-up gpt.a and gpt.b, the
test files the tier and fake-CUDA tests write: test_example.py, test_x.py).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

from helpers import REPO

PATH = re.compile(r"(?<![\w./-])(?:gpt|tests)/[\w/]+\.py\b")
# a test file by its name alone ("test_memory.py's cases"): one of tests/'s files
TEST_FILE = re.compile(r"(?<![\w./-])test_\w+\.py\b")
DOTTED = re.compile(r"(?<![\w.])gpt(?:\.\w+)+")
# "gpt/core/fileio.py's FolderLock": a file's name, then one of its names (a word with an
# underscore, or in CamelCase: not "gpt/model/fused_ce.py's Triton kernels")
OWNED = re.compile(r"(?<![\w./-])(gpt/[\w/]+\.py)'s (\w*_\w*|[A-Z][a-z]+[A-Z]\w*)")
RECORDS = re.compile(r"^(benchmarks/gpu/\d{4}-|tests/fixtures/)|\.(json|jsonl|log|patch)$")
PLACEHOLDERS = {"gpt.x", "gpt.a", "gpt.b", "test_example.py", "test_x.py"}
TEXT = re.compile(r"\.(md|py|toml|txt|sh|sbatch|cfg|ini|yaml)$|^\.ci/run$")


def texts() -> list[str]:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    return [f for f in files if TEXT.search(f) and not RECORDS.search(f)
            and f != "tests/project/test_names_in_text.py" and (REPO / f).is_file()]


def prose(path: str, text: str) -> str:
    """What in a file is text rather than code: a Python file's strings and comments (its
    code names things through imports, which the tests run; a variable called `gpt` is not
    the package), any other file whole."""
    if not path.endswith(".py"):
        return text
    kept = [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type in (tokenize.STRING, tokenize.COMMENT)]
    return "\n".join(kept)


def top_level_names(module: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def resolves(dotted: str, root: Path = REPO) -> bool:
    """gpt.a.b.c names a module (gpt/a/b/c.py or a package) or, after the longest module
    among its prefixes, a name defined at that module's top (its attributes not followed)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            return i == len(parts) or parts[i] in top_level_names(module)
    return False


def unknown_names(path: str, text: str, root: Path = REPO) -> list[str]:
    body = prose(path, text)
    bad = [p for p in PATH.findall(body) if not (root / p).is_file()]
    tests = {p.name for p in (root / "tests").rglob("test_*.py")}
    bad += [t for t in TEST_FILE.findall(body) if t not in tests and t not in PLACEHOLDERS]
    bad += [d for d in DOTTED.findall(body)
            if d not in PLACEHOLDERS and not resolves(d.rstrip("."), root)]
    bad += [f"{path_}'s {name}" for path_, name in OWNED.findall(body)
            if (root / path_).is_file() and name not in top_level_names(root / path_)]
    return sorted(set(bad))


def test_every_file_and_module_named_in_the_projects_text_exists() -> None:
    files = texts()
    assert "docs/MAP.md" in files and "gpt/train/loop.py" in files and "README.md" in files
    found = {f: bad for f in files
             if (bad := unknown_names(f, (REPO / f).read_text(encoding="utf-8", errors="replace")))}
    assert not found, found


def test_a_name_left_from_before_a_move_is_seen(tmp_path: Path) -> None:
    """The check on a copy of the package's shape: names that moved are seen, in prose and
    in a Python file's docstring and comment; code (a variable called gpt) is not read."""
    (tmp_path / "gpt" / "report").mkdir(parents=True)
    (tmp_path / "gpt" / "__init__.py").write_text("")
    (tmp_path / "gpt" / "report" / "__init__.py").write_text("")
    (tmp_path / "gpt" / "report" / "flops.py").write_text("PEAK = 1\ndef flops_per_token(): pass\n")
    good = ("`gpt/report/flops.py`, gpt.report.flops.flops_per_token and gpt.report.flops.PEAK, "
            "gpt/report/flops.py's flops_per_token and its Triton kernels.")
    assert unknown_names("docs/x.md", good, tmp_path) == []
    moved = ("`gpt/metrics.py`'s gpt.report.metrics.flops_per_token; gpt.report.flops.peak; "
             "gpt/report/flops.py's MetricsLog, not its Triton kernels")
    assert unknown_names("docs/x.md", moved, tmp_path) == [
        "gpt.report.flops.peak", "gpt.report.metrics.flops_per_token", "gpt/metrics.py",
        "gpt/report/flops.py's MetricsLog"]
    code = ('"""See gpt/metrics.py."""\n'
            "# and gpt.report.metrics.\n"
            "block = gpt.config.block_size\n")
    assert unknown_names("gpt/x.py", code, tmp_path) == ["gpt.report.metrics", "gpt/metrics.py"]
    (tmp_path / "tests" / "plan").mkdir(parents=True)
    (tmp_path / "tests" / "plan" / "test_memory.py").write_text("")
    tests = "tests/plan/test_memory.py, test_memory.py; tests/test_memory.py, test_memry.py"
    assert unknown_names("docs/x.md", tests, tmp_path) == ["test_memry.py", "tests/test_memory.py"]
