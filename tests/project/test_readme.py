"""The README as a user meets it: short enough to read as a path, its two commands the ones
CI runs exactly, every file it points to there, and the planner's figures it quotes the
ones the planner prints."""

from __future__ import annotations

import re

import pytest

from helpers import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
MAX_LINES = 450


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S)


def test_it_is_a_users_path_of_at_most_450_lines():
    assert len(README.splitlines()) <= MAX_LINES
    sections = re.findall(r"^## (\d+)\. (.+)$", README, flags=re.M)
    assert [int(n) for n, _ in sections] == list(range(1, len(sections) + 1))
    titles = [t.lower() for _, t in sections]
    order = ["install", "first run", "data", "124m on one gpu", "many gpus", "resume", "evaluate",
             "benchmarks"]
    found = [next(i for i, t in enumerate(titles) if key in t) for key in order]
    assert found == sorted(found), titles  # in the order a user does them


def test_its_two_commands_are_what_ci_runs_first_in_a_fresh_environment():
    """A reader who follows it in order on a laptop makes a virtual environment and installs
    torch's CPU build before anything pulls in torch; then the two commands CI runs."""
    env, two = (block.splitlines() for block in code_blocks(README)[:2])
    assert env[0].startswith("python3 -m venv .venv && source .venv/bin/activate")
    assert env[1].startswith("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert [line.split("#")[0].strip() for line in two] == ['pip install -e ".[dev]"',
                                                              "python -m pytest"]
    ci = (REPO / ".ci" / "run").read_text()
    readme_part = ci[ci.index("python3 -m venv .venv-readme"):ci.index("rm -rf .venv-readme\n\n")]
    assert 'pip install --quiet --no-cache-dir -e ".[dev]"' in readme_part
    assert "\n  python -m pytest\n" in readme_part
    assert "torch==" not in readme_part and "--upgrade pip" not in readme_part  # nothing else


COMMANDS = ("python", "torchrun", "pip ", "launch/", "sbatch", "gpt2-lm-eval", "OMP_NUM_THREADS",
            "NNODES", "TORCH_DISABLE")


def test_every_command_runs_as_written_or_names_its_placeholders():
    """No command elides what it needs with `...` (section 7's `--out-dir runs/124M ...`):
    each, in a bash block or inline, is complete, or names its placeholders (NODE0_HOST)."""
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    lines += [span for span in re.findall(r"`([^`\n]+)`", README) if span.startswith(COMMANDS)]
    commands = [line.split(" #")[0] for line in lines if line.strip().startswith(COMMANDS)]
    assert len(commands) > 40  # the README's commands were found
    elided = [c for c in commands if "..." in c]
    assert not elided, elided


def test_every_file_it_points_to_exists():
    paths = set(re.findall(r"\]\(((?:docs|benchmarks|examples|configs|launch|gpt)/[^)#]*)\)", README))
    paths |= set(re.findall(r"`((?:docs|benchmarks|examples|configs|launch|gpt)/[\w./-]+)`", README))
    assert {"docs/MAP.md", "docs/memory.md", "docs/reliability.md", "docs/evaluation.md",
            "docs/speedrun.md", "benchmarks/gpu/README.md"} <= paths  # the details it leaves out
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, missing


@pytest.mark.slow
def test_the_planner_figures_it_quotes_are_what_the_planner_prints():
    from gpt.core.cli import parse_args
    from gpt.plan import memory

    recipe = ["--config", str(REPO / "configs" / "gpt2-124m.toml")]
    quoted = re.search(r"prints a peak of ([\d.]+) GiB per GPU as the\s+recipe runs on CUDA "
                       r"\(compiled, the whole logits\), ([\d.]+) GiB with `--chunked-loss`", README)
    assert quoted, "the memory figures' sentence changed: update this test with it"
    for flags, figure in (([], quoted.group(1)), (["--chunked-loss"], quoted.group(2))):
        plan = memory.plan(parse_args([*recipe, *flags]), device_type="cuda")
        assert f"{plan.peak_bytes / 2**30:.1f}" == figure


@pytest.mark.slow
def test_its_torchrun_line_for_a_cpu_runs_as_written(tmp_path):
    """Section 6's two processes on a CPU: the line as printed (a literal `...` once ended
    it), on section 2's data, shortened by flags after it (which win)."""
    import shlex

    from helpers import read_metrics, run_torchrun, write_random_shards

    line = next(line for line in README.splitlines()
                if line.startswith("torchrun ") and "--nproc_per_node=2" in line)
    argv = shlex.split(line)
    assert argv[:4] == ["torchrun", "--standalone", "--nproc_per_node=2", "train_gpt2.py"], line
    assert "..." not in argv and (REPO / "configs" / "cpu-demo.toml").is_file()
    data = write_random_shards(tmp_path, seed=0, train=(30_000,), val=(5_000,))
    out = tmp_path / "run"
    proc = run_torchrun(*argv[4:], "--data-dir", str(data), "--out-dir", str(out),
                        "--max-steps", "2", "--sample-every", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_metrics(out, "run")[0]["world_size"] == 2
    assert [r["step"] for r in read_metrics(out, "train")][-1] == 1
