"""tests/ has the package's shape (docs/MAP.md, "The tests"): a test file is in the folder of
the stage whose modules it tests, or in commands/, runs/ or project/; no two files share a
name (pytest imports them by it, and a reader looks them up by it); and every stage of gpt/
has its folder."""

from __future__ import annotations

from collections import Counter

from helpers import REPO

TESTS = REPO / "tests"
WHOLE = {"commands", "runs", "project"}  # the commands end to end, whole runs, the project


def stages() -> set[str]:
    return {p.parent.name for p in (REPO / "gpt").glob("*/__init__.py")} - {"assets"}


def test_every_test_file_is_in_a_stage_folder_or_a_whole_one() -> None:
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 50
    outside = [str(f.relative_to(TESTS)) for f in files
               if f.parent.parent != TESTS or f.parent.name not in stages() | WHOLE]
    assert not outside, f"test files outside tests/<stage>/ (docs/MAP.md, 'The tests'): {outside}"


def test_every_stage_has_its_folder_and_no_folder_is_left_over() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders == stages() | WHOLE, (folders ^ (stages() | WHOLE))


def test_no_two_test_files_share_a_name() -> None:
    twice = [name for name, n in Counter(f.name for f in TESTS.rglob("test_*.py")).items() if n > 1]
    assert not twice, twice
