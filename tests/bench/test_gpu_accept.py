"""The GPU acceptance command (`python -m gpt.bench gpu`) on the CPU: --plan for all stages
or a choice of them, under a budget; stages by name; what a stage needs from the user
(--nanogpt, --corpus, a package) checked before anything runs, in one line naming the
flag; wheels installed from --wheels for the cells only; --budget skipping the cells that
no longer fit; each stage in --smoke writing the schema the GPU run writes; a cell's
timeout killing its whole process group."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch

from gpt.bench import runs
from gpt.bench.cli import main as bench_main
from gpt.bench.gpu import accept as gpu
from gpt.bench.gpu import cell_run
from gpt.bench.gpu import inputs as gpu_inputs
from gpt.bench.gpu import plan as gpu_plan
from gpt.bench.gpu import stages as gpu_stages
from gpt.bench.gpu.estimates import WARMUP, pytest_estimate
from gpt.bench.gpu.inputs import Packages
from gpt.bench.record import REPO
from helpers import only_line

CELL_KEYS = {"name", "kind", "params", "status", "estimate_s"}
FIGURES = {"step_ms", "tokens_per_s_median", "mfu_median", "compile_s_estimate", "final_loss",
           "losses", "tokens_per_step", "warmup_steps_excluded"}
SMOKE = gpu_stages.Sizes.make(smoke=True)
NOWHERE = gpu_stages.Where(Path("/d"), Path("/w"), Path("/t"), Path("/corpus"), 4)
DOC = REPO / "benchmarks" / "gpu" / "README.md"


def refuse_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cell ran")

    monkeypatch.setattr(cell_run, "run_group", refuse)
    monkeypatch.setattr(gpu, "run_stages", refuse)


# ---------------------------------------------------------------------------------------
# --plan


def test_plan_lists_every_stage_its_cells_and_estimates(capsys, monkeypatch) -> None:
    refuse_to_run(monkeypatch)
    assert bench_main(["gpu", "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    stages = plan["stages"]
    assert [s["stage"] for s in stages] == list(gpu_stages.STAGES) and plan["budget_s"] is None
    assert "not measured" in plan["estimates"]
    for s in stages:
        cells = gpu_stages.stage_cells(s["stage"], gpu_stages.FULL, NOWHERE)
        assert [c["name"] for c in s["cells"]] == [c.name for c in cells]
        # a cell whose command an earlier stage runs is measured once, there
        assert all((c["estimate_s"] > 0 or c.get("same_as")) and c["fits"] for c in s["cells"])
        assert s["estimate_s"] == sum(c["estimate_s"] for c in s["cells"])
    assert plan["total_s"] == sum(s["estimate_s"] for s in stages)
    by_name = {s["stage"]: s for s in stages}
    assert by_name["throughput"]["needs"] == ["nanogpt"] and by_name["tokens"]["needs"] == ["corpus"]
    assert by_name["fp8"]["optional_packages"] == ["torchao"] and not by_name["fp8"]["measured"]
    assert all("requires" not in s for s in stages)  # a missing package skips cells, not stages
    assert [c["name"] for c in by_name["throughput"]["cells"]] == [
        "ours-b64-default", "build-nanogpt-b64", "ours-b32-default", "build-nanogpt-b32",
        "ours-b16-default", "build-nanogpt-b16"]
    assert bench_main(["gpu", "--plan"]) == 0
    text = capsys.readouterr().out
    assert f"about {plan['total_s']} s" in text and "needs --nanogpt PATH" in text
    assert "fp8 *:" in text and "throughput:" in text and "needs --corpus DIR" in text


def test_plan_for_a_choice_of_stages_under_a_budget(capsys, monkeypatch) -> None:
    refuse_to_run(monkeypatch)
    assert bench_main(["gpu", "--plan", "xl", "throughput", "--budget", "300", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [s["stage"] for s in plan["stages"]] == ["xl", "throughput"] and plan["budget_s"] == 300
    used, fits = 0, []
    for cell in (c for s in plan["stages"] for c in s["cells"]):  # in order, as a run skips them
        fits.append(used + cell["estimate_s"] <= 300 - gpu_plan.RESERVE_S)  # as the run keeps back
        used += cell["estimate_s"] if fits[-1] else 0
    assert [c["fits"] for s in plan["stages"] for c in s["cells"]] == fits
    assert True in fits and False in fits  # the choice is such that some fit and some do not
    assert bench_main(["gpu", "--plan", "xl", "throughput", "--budget", "300"]) == 0
    text = capsys.readouterr().out
    assert "skipped under --budget 300" in text and "would not fit and be skipped" in text
    assert "fp8" not in text


def test_plan_of_chosen_cells_counts_a_command_two_stages_share_once(capsys, monkeypatch) -> None:
    """--plan honours --only, and the fp8 stage's bf16 cell, which the throughput stage
    also runs, is planned once: the second stage reuses the measurement."""
    refuse_to_run(monkeypatch)
    only = ["ours-b64-default", "ours-b64-default-fp8-tensorwise", "build-nanogpt-b64"]
    assert bench_main(["gpu", "--plan", "fp8", "throughput", "--only", *only, "--json"]) == 0
    fp8, throughput = json.loads(capsys.readouterr().out)["stages"]
    assert [c["name"] for c in fp8["cells"]] == only[:2]
    assert [c["name"] for c in throughput["cells"]] == [only[0], only[2]]
    shared = throughput["cells"][0]
    assert shared["estimate_s"] == 0 and shared["same_as"] == "fp8" and "same_as" not in fp8["cells"][0]
    assert throughput["estimate_s"] == throughput["cells"][1]["estimate_s"]
    assert bench_main(["gpu", "--plan", "fp8", "throughput", "--only", *only]) == 0
    assert "as measured in stage fp8" in capsys.readouterr().out


def test_a_command_two_stages_share_runs_once(tmp_path, capsys, monkeypatch) -> None:
    """Run: the throughput stage takes the fp8 stage's measurement of the same command,
    says so in its JSON and summary, and spends none of the budget on it."""
    ran = []

    def fake_cell(cell, limit_s, sizes, tokens, nanogpt_path, tmp, log, packages=None):
        ran.append(cell.name)
        return {"name": cell.name, "kind": cell.kind, "params": cell.params,
                "estimate_s": round(cell.estimate_s), "status": "ok", "seconds": 1.0}

    monkeypatch.setattr(gpu, "run_cell", fake_cell)
    out = tmp_path / "out"
    assert bench_main(["gpu", "fp8", "throughput", "--smoke", "--out", str(out),
                       "--only", "ours-b8-default", "ours-b4-default"]) == 0
    assert ran == ["ours-b8-default", "ours-b4-default"]
    fp8, throughput = (json.loads((out / f"gpu_{s}.json").read_text())["cells"]
                       for s in ("fp8", "throughput"))
    assert [c["name"] for c in throughput] == ["ours-b8-default", "ours-b4-default"]
    assert throughput[0] == {**fp8[0], "same_as": "fp8"} and "same_as" not in throughput[1]
    assert "| ok, as in fp8 |" in (out / "gpu_throughput.md").read_text().replace("  ", "")


def test_the_users_guide_says_what_the_plan_says() -> None:
    """benchmarks/gpu/README.md's table of stages: each stage's row ends with the plan's
    estimate, marked rough where the plan marks it."""
    doc = DOC.read_text()
    rows = {line.split(" | ")[0][3:-1]: line for line in doc.splitlines() if line.startswith("| `")}
    for s in (gpu_plan.plan([name], None)["stages"][0] for name in gpu_stages.STAGES):
        assert rows[s["stage"]].endswith(f"| ~{s['estimate_s']} s{'' if s['measured'] else ' *'} |")
    assert "--nanogpt" in doc and "--wheels" in doc and "--corpus" in doc and "--budget" in doc


# ---------------------------------------------------------------------------------------
# cells, by their command lines


def test_a_cell_loss_is_the_default_or_one_of_five(monkeypatch) -> None:
    flags = {loss: gpu_stages.ours_cell(SMOKE, NOWHERE, 8, loss=loss) for loss in gpu_stages.LOSSES}
    assert [c.name for c in flags.values()] == [
        "ours-b8-default", "ours-b8-default-unchunked", "ours-b8-default-liger", "ours-b8-default-cce",
        "ours-b8-default-fused", "ours-b8-default-fused-forward"]
    assert all(c.params["loss"] == loss for loss, c in flags.items())
    assert "--no-chunked-loss" in flags["unchunked"].cmd
    assert argv_of(flags["fused"]).endswith("--loss-kernel fused --warmup-steps 10")
    # the forward mode's cell: the same trainer flags, run through gpt/bench/gpu/fused_mode.py,
    # which sets the mode and hands them to the trainer's command
    forward = flags["fused-forward"]
    assert argv_of(forward).replace("-fused-forward", "-fused") == argv_of(flags["fused"])
    assert forward.cmd[1:4] == ["-m", "gpt.bench.gpu.fused_mode", "forward"]
    assert forward.cmd[4:] == forward.params["trainer_argv"]
    from gpt.bench.gpu import fused_mode
    from gpt.model import loss_kernels

    seen = []
    monkeypatch.setattr(fused_mode, "train_main", lambda argv: seen.append(
        (loss_kernels.FUSED_MODE, loss_kernels.describe(False, "fused"), argv)) or 0)
    monkeypatch.setattr(loss_kernels, "FUSED_MODE", loss_kernels.FUSED_MODE)  # put back after
    assert fused_mode.main(forward.cmd[3:]) == 0
    assert seen == [("forward", "whole logits (fused, forward mode)", forward.cmd[4:])]
    assert fused_mode.main(["sideways", "--max-steps", "1"]) == 2 and len(seen) == 1
    assert "--chunked-loss" not in flags["default"].cmd and "--loss-kernel" not in flags["default"].cmd
    # ours is not offered on CUDA (gpt/model/loss_kernels.py): no cell asks for it
    assert not any("ours" in c.cmd for c in flags.values())
    with pytest.raises(ValueError, match="loss must be one of default, unchunked, liger, cce, fused, "
                                         "fused-forward"):
        gpu_stages.ours_cell(SMOKE, NOWHERE, 8, loss="chunked")


def argv_of(cell: gpu_stages.Cell) -> str:
    return " ".join(cell.params["trainer_argv"])


def test_fp8_speedrun_and_loss_check_cells_are_these_command_lines() -> None:
    full = gpu_stages.FULL
    bf16, tensorwise, rowwise = gpu_stages.stage_cells("fp8", full, NOWHERE)[:3]  # then XL's
    assert [c.name for c in (bf16, tensorwise, rowwise)] == [
        "ours-b64-default", "ours-b64-default-fp8-tensorwise", "ours-b64-default-fp8-rowwise"]
    assert "--fp8" not in bf16.cmd and tensorwise.cmd[-2:] == ["--compile-mode", "default"]
    assert "--batch-size 64 --total-batch-tokens 131072" in argv_of(tensorwise)
    assert "--fp8 tensorwise" in argv_of(tensorwise) and "--fp8 rowwise" in argv_of(rowwise)
    assert tensorwise.estimate_s > bf16.estimate_s  # FP8 compiles more (an estimate)
    base, fp8 = gpu_stages.stage_cells("fp8-loss", full, NOWHERE)
    for cell in (base, fp8):  # 200 steps on the user's corpus, the same schedule
        assert "--max-steps 200 " in argv_of(cell) and "--data-dir /corpus " in argv_of(cell)
        assert "--warmup-steps 10" in argv_of(cell)
    assert "--fp8" not in argv_of(base) and "--fp8 tensorwise" in argv_of(fp8)
    gpt2, speedrun = gpu_stages.stage_cells("speedrun", full, NOWHERE)
    assert argv_of(speedrun).startswith(f"--config {REPO / 'configs/gpt2-124m-speedrun.toml'} ")
    assert argv_of(gpt2).startswith(f"--config {REPO / 'configs/gpt2-124m.toml'} ")
    assert "--warmup-steps" not in argv_of(speedrun)  # the recipe keeps its own schedule
    # and its own tokens a step: Muon's cost is weighed against the tokens the recipe steps by
    for cell in (gpt2, speedrun):
        assert "--total-batch-tokens 524288 " in argv_of(cell) and cell.params["tokens_per_step"] == 524288
    assert "--hellaswag-every 0" in argv_of(speedrun) and "--no-save-checkpoints" in argv_of(speedrun)
    assert (gpt2.params["recipe"], speedrun.params["recipe"]) == ("gpt2", "speedrun")


def test_the_cuda_tests_spread_over_the_workers_one_test_at_a_time() -> None:
    """The CUDA tests' cell hands tests, not files, to its workers (the settings' loadfile
    would put tests/runs/test_cuda.py's 22 on one worker), and its estimate is the busiest
    worker's share of the tests' measured seconds: under the serial sum, over the longest
    test, and over the sum of any one file's tests over the workers."""
    from gpt.bench.gpu.estimates import CUDA_TESTS, PYTEST_START_S

    serial, parallel = pytest_estimate(1), pytest_estimate(4)
    assert serial == pytest.approx(PYTEST_START_S + sum(CUDA_TESTS.values()))
    assert PYTEST_START_S + max(CUDA_TESTS.values()) <= parallel < serial / 2
    cuda_file = sum(s for t, s in CUDA_TESTS.items() if t.startswith("runs/test_cuda.py::"))
    assert parallel < PYTEST_START_S + cuda_file  # what one worker took under loadfile
    cell = gpu_stages.pytest_cell(Path("/t"), 4)
    assert cell.cmd[-5:] == ["-n", "4", "--dist", "load", str(REPO / "tests")]
    assert cell.estimate_s == parallel
    assert "-n" not in gpu_stages.pytest_cell(Path("/t"), 0).cmd


@pytest.mark.slow
def test_the_cuda_tests_estimate_names_every_cuda_test() -> None:
    """gpt/bench/gpu/estimates.py's CUDA_TESTS holds a figure for exactly the tests that
    `pytest -m cuda` collects, in their order: a test added or renamed is planned for."""
    from gpt.bench.gpu.estimates import CUDA_TESTS

    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "--collect-only", "-q",
                           "-n", "0", "-p", "no:cacheprovider", "tests"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    collected = [line.removeprefix("tests/") for line in proc.stdout.splitlines() if "::" in line]
    assert collected == list(CUDA_TESTS), proc.stdout[-3000:]


# ---------------------------------------------------------------------------------------
# what a stage needs, checked before anything runs


def bench_refusal(capsys, argv: list[str], code: int = 1) -> str:
    """`python -m gpt.bench gpu ARGV`, refused: exit status `code` and one line, returned."""
    assert bench_main(["gpu", *argv]) == code
    return only_line(capsys.readouterr().err)


STAND_IN = "B = 64 # micro batch size\n"  # a script without build-nanogpt's other lines


def test_a_stage_without_its_input_fails_in_one_line_running_nothing(tmp_path, capsys,
                                                                     monkeypatch) -> None:
    refuse_to_run(monkeypatch)
    out = tmp_path / "out"
    err = bench_refusal(capsys, ["throughput", "--out", str(out)])
    assert "stage throughput" in err and "--nanogpt PATH" in err and "nothing was run" in err
    err = bench_refusal(capsys, ["throughput", "--out", str(out), "--nanogpt", str(tmp_path / "no.py")])
    assert f"--nanogpt {tmp_path / 'no.py'}" in err and "not found" in err
    (tmp_path / "train_gpt2.py").write_text(STAND_IN)  # a folder holding a changed script
    err = bench_refusal(capsys, ["throughput", "--out", str(out), "--nanogpt", str(tmp_path)])
    assert "its script changed" in err
    for stage in ("fp8-loss", "tokens"):
        err = bench_refusal(capsys, [stage, "--out", str(out)])
        assert f"stage {stage} needs --corpus DIR" in err
    (tmp_path / "corpus").mkdir()
    err = bench_refusal(capsys, ["tokens", "--out", str(out), "--corpus", str(tmp_path / "corpus")])
    assert f"stage tokens: --corpus {tmp_path / 'corpus'}: no train_* shards" in err
    assert not out.exists()
    if not torch.cuda.is_available():  # no package stops a stage: past the checks
        monkeypatch.setattr(gpu_inputs, "importable", lambda module: False)
        err = bench_refusal(capsys, ["fp8", "--out", str(out), "--wheels", str(tmp_path)], 2)
        assert "no CUDA device" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_stage_without_its_baseline_cell_needs_no_nanogpt(tmp_path, capsys, monkeypatch) -> None:
    refuse_to_run(monkeypatch)
    err = bench_refusal(capsys, ["throughput", "--out", str(tmp_path), "--only", "ours-b16-default"], 2)
    assert "no CUDA device" in err and "--smoke" in err


def test_bad_flags_are_one_line_errors(capsys) -> None:
    for argv, says in (([], "name the stages to run (or all)"),
                       (["cuda-tests"], "need --out DIR"),
                       (["7", "--out", "o"], "unknown stage '7': the stages are cuda-tests, throughput"),
                       (["xl", "--out", "o", "--json"], "--json goes with --plan"),
                       (["xl", "--out", "o", "--only", "nope"], "--only nope: not a cell of xl"),
                       (["--plan", "xl", "--only", "nope"], "--only nope: not a cell of xl"),
                       (["xl", "--out", "o", "--budget", "0"], "--budget")):
        with pytest.raises(SystemExit) as exc:
            bench_main(["gpu", *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 2, err  # the error, then the hint


# ---------------------------------------------------------------------------------------
# --wheels


def wheel(folder: Path, module: str, body: str = "MARK = 'from the wheel'\n") -> Path:
    """A minimal pure-Python wheel of `module`."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{module}-0.0.1-py3-none-any.whl"
    info = f"{module}-0.0.1.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", body)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{module}/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n"
                                     f"{info}/RECORD,,\n")
    return path


def cells_of(*stages: str, only: tuple[str, ...] = ()) -> list[gpu_stages.Cell]:
    return [c for stage in stages for c in gpu_stages.stage_cells(stage, gpu_stages.FULL, NOWHERE)
            if not only or c.name in only]


def test_wheels_are_installed_for_the_cells_only_where_not_importable(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_inputs, "importable", lambda module: module == "cut_cross_entropy")
    wheels = tmp_path / "wheels"
    wheel(wheels, "liger_kernel")
    packages = gpu_inputs.prepare(cells_of("loss-kernels", "xl"), wheels, tmp_path / "site")
    assert packages.status == {"liger_kernel": f"installed from {wheels / 'liger_kernel-0.0.1-py3-none-any.whl'}",
                               "cut_cross_entropy": "importable"} and not packages.missing
    assert (tmp_path / "site" / "liger_kernel" / "__init__.py").is_file()
    probe = subprocess.run([sys.executable, "-c", "import liger_kernel; print(liger_kernel.MARK)"],
                           env={"PATH": "/usr/bin:/bin", **packages.env}, capture_output=True, text=True)
    assert probe.stdout.strip() == "from the wheel", probe.stderr
    monkeypatch.setattr(gpu_inputs, "importable", lambda module: False)
    missing = gpu_inputs.prepare(cells_of("loss-kernels"), None, tmp_path / "site2")
    assert not missing.env and set(missing.missing) == {"liger_kernel", "cut_cross_entropy"}
    assert "no --wheels DIR was given" in missing.missing["liger_kernel"]
    # a cell whose package is missing is skipped with the reason, on the GPU as well
    liger = gpu_stages.ours_cell(gpu_stages.FULL, NOWHERE, 64, loss="liger")
    record = gpu.run_cell(liger, 60, gpu_stages.FULL, gpu.make_tokens(10, 10), None, tmp_path, None, missing)
    assert record["status"] == "skipped" and record["reason"] == missing.missing["liger_kernel"]
    assert gpu_inputs.prepare(cells_of("xl", "throughput"), None, tmp_path / "site3") == Packages()


def test_only_the_packages_the_chosen_cells_use_are_looked_at(tmp_path, monkeypatch) -> None:
    """--only loss-bench of loss-kernels: none (the stage's Liger and Cut Cross-Entropy cells
    are not chosen); the CUDA tests use Liger and Cut Cross-Entropy where there are
    (theirs skip without), the fp8 stage's FP8 cells need torchao, its bf16 cells nothing."""
    looked: list[str] = []
    monkeypatch.setattr(gpu_inputs, "importable", lambda module: looked.append(module) or True)
    assert gpu_inputs.prepare(cells_of("loss-kernels", only=("loss-bench",)), tmp_path, tmp_path) == Packages()
    assert looked == []
    gpu_inputs.prepare(cells_of("loss-kernels", "fp8", only=("loss-bench", "ours-b64-default",
                                                              "ours-b64-default-liger")), tmp_path, tmp_path)
    assert looked == ["liger_kernel"]
    looked.clear()
    gpu_inputs.prepare(cells_of("cuda-tests", "fp8"), tmp_path, tmp_path)
    assert looked == ["liger_kernel", "cut_cross_entropy", "torchao"]
    by_name = {c.name: c for c in cells_of("cuda-tests", "fp8")}
    assert by_name["pytest-cuda"].needs == () and by_name["ours-b64-default"].needs == ()
    assert by_name["ours-b64-default-fp8-tensorwise"].needs == ("torchao",)


@pytest.mark.slow
def test_a_wheel_that_does_not_install_or_import_skips_only_its_cells(tmp_path, capsys,
                                                                      monkeypatch) -> None:
    """A wheel that installs but does not import, or that pip cannot install: its package is
    missing, with the reason in one line; the cells that need it are skipped with it, and
    every other cell runs (the bf16 cells beside FP8's)."""
    monkeypatch.setattr(gpu_inputs, "importable", lambda module: False)
    wheels = tmp_path / "wheels"
    wheel(wheels, "torchao", body="raise ImportError('needs a newer torch')\n")
    wheel(wheels, "liger_kernel")
    cells = cells_of("fp8", "loss-kernels", only=("ours-b64-default-fp8-tensorwise",
                                                  "ours-b64-default-liger"))
    cells.insert(0, gpu_stages.ours_cell(gpu_stages.FULL, NOWHERE, 64))  # bf16, beside FP8
    packages = gpu_inputs.prepare(cells, wheels, tmp_path / "site")
    assert packages.missing == {"torchao": f"--wheels {wheels}: torchao-0.0.1-py3-none-any.whl installed "
                                           "but `import torchao` fails: ImportError: needs a newer torch"}
    assert packages.status == {"liger_kernel": f"installed from {wheels / 'liger_kernel-0.0.1-py3-none-any.whl'}"}
    ran = []
    monkeypatch.setattr(cell_run, "run_group", lambda cmd, *a, **k: ran.append(cmd) or (1, "", "stand-in"))
    records = {c.name: gpu.run_cell(c, 60, gpu_stages.FULL, gpu.make_tokens(10, 10), None, tmp_path,
                                    io_log(), packages) for c in cells}
    assert records["ours-b64-default-fp8-tensorwise"]["status"] == "skipped"
    assert records["ours-b64-default-fp8-tensorwise"]["reason"] == packages.missing["torchao"]
    assert len(ran) == 2 and all(r["status"] != "skipped" for n, r in records.items() if "fp8" not in n)
    (wheels / "torchao-0.0.1-py3-none-any.whl").write_text("not a zip")
    broken = gpu_inputs.prepare(cells, wheels, tmp_path / "site2")
    assert broken.missing["torchao"].startswith(f"--wheels {wheels}: pip could not install "
                                                "torchao-0.0.1-py3-none-any.whl: ")
    assert "\n" not in broken.missing["torchao"] and "liger_kernel" in broken.status
    # the command: the stage runs, saying why once (the cells said nothing was run before)
    capsys.readouterr()
    monkeypatch.setattr(gpu, "run_cell", fake_cells(names := []))
    assert bench_main(["gpu", "fp8", "--smoke", "--out", str(tmp_path / "out"), "--wheels",
                       str(wheels)]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("torchao:")]
    assert said == [f"torchao: {broken.missing['torchao'].splitlines()[0]}; the cells that need "
                    "it are skipped"] and names


def io_log():
    import io

    return io.StringIO()


# ---------------------------------------------------------------------------------------
# --budget


def test_the_budget_skips_the_cells_that_no_longer_fit(tmp_path, capsys, monkeypatch) -> None:
    """The clock advances by each cell's estimate as it runs: a budget of 165 s, less the
    15 s kept for stopping a cell and writing, runs the throughput stage's first two cells
    (72 + 64 s) and skips the rest, saying why; each cell may run only as long as leaves
    that reserve."""
    now = [1000.0]
    limits = []

    def fake_cell(cell, limit_s, sizes, tokens, nanogpt_path, tmp, log, packages=None):
        limits.append(limit_s)
        now[0] += cell.estimate_s
        return {"name": cell.name, "kind": cell.kind, "params": cell.params,
                "estimate_s": round(cell.estimate_s), "status": "failed", "reason": "not run here"}

    monkeypatch.setattr(gpu, "clock", lambda: now[0])
    monkeypatch.setattr(gpu, "run_cell", fake_cell)
    out = tmp_path / "out"
    assert bench_main(["gpu", "throughput", "--smoke", "--budget", "165", "--out", str(out)]) == 1
    report = json.loads((out / "gpu_throughput.json").read_text())
    cells = report["cells"]
    assert [c["status"] for c in cells] == ["failed", "failed", "skipped", "skipped", "skipped", "skipped"]
    est = [c.estimate_s for c in gpu_stages.stage_cells("throughput", SMOKE, NOWHERE)]
    reserve = gpu_plan.RESERVE_S
    assert limits == pytest.approx([165 - reserve, 165 - reserve - est[0]]) and report["budget_s"] == 165
    left = 165 - est[0] - est[1]
    assert cells[2]["reason"] == (f"budget: {left:.0f} s left of 165 ({reserve:.0f} kept for stopping "
                                  f"and writing), the cell needs about {est[2]:.0f}; run it with "
                                  "--only ours-b4-default")
    assert report["schema"] == gpu.SCHEMA and report["stage"] == "throughput"


def test_a_budget_too_small_for_any_cell_runs_none_and_keeps_earlier_results(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cell_run, "run_group", lambda *a, **k: pytest.fail("a cell ran"))
    for n in (1, 2):
        assert bench_main(["gpu", "xl", "cuda-tests", "--smoke", "--budget", "5", "--out", str(tmp_path)]) == 0
    for stem in ("gpu_xl", "gpu_xl-2", "gpu_cuda-tests", "gpu_cuda-tests-2"):
        report = json.loads((tmp_path / f"{stem}.json").read_text())
        assert report["cells"]  # the xl stage has two, cuda-tests one: none ran
        for cell in report["cells"]:
            assert cell["status"] == "skipped" and cell["reason"].startswith("budget: 5 s left of 5")
        assert (tmp_path / f"{stem}.md").read_text().startswith("# GPU acceptance, stage ")


def fake_cells(ran: list[str], then=None):
    """A run_cell that runs nothing: records the cell, calls `then(cell)`, reports it
    skipped (no figures to compare)."""
    def fake_cell(cell, limit_s, sizes, tokens, nanogpt_path, tmp, log, packages=None):
        ran.append(cell.name)
        if then is not None:
            then(cell)
        return {"name": cell.name, "kind": cell.kind, "params": cell.params,
                "estimate_s": round(cell.estimate_s), "status": "skipped", "reason": "not run here"}
    return fake_cell


def test_stages_run_in_the_order_given(tmp_path, monkeypatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(gpu, "run_cell", fake_cells(ran))
    assert bench_main(["gpu", "speedrun", "xl", "--smoke", "--out", str(tmp_path)]) == 0
    assert ran == ["recipe-gpt2-b8", "recipe-speedrun-b8", "tiny-fsdp-ac-1gpu", "tiny-auto-1gpu"]


def test_each_cells_results_are_on_disk_before_the_next_runs(tmp_path, monkeypatch) -> None:
    """Written after every cell: a run killed outright (SIGKILL, a machine taken back)
    leaves every finished cell's figures and the summary of what ran."""
    seen: list[list[str]] = []

    def look(cell) -> None:
        path = tmp_path / "gpu_xl.json"
        seen.append([c["name"] for c in json.loads(path.read_text())["cells"]] if path.exists() else [])

    monkeypatch.setattr(gpu, "run_cell", fake_cells([], look))
    assert bench_main(["gpu", "xl", "--smoke", "--out", str(tmp_path)]) == 0
    assert seen == [[], ["tiny-fsdp-ac-1gpu"]]
    report = json.loads((tmp_path / "gpu_xl.json").read_text())
    assert report["finished"] and len(report["cells"]) == 2


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="Python takes signals in the main thread only")
def test_sigterm_stops_the_cell_and_writes_what_there_is(tmp_path, capsys, monkeypatch) -> None:
    """SIGTERM while a cell runs (what a time limit sends): that cell is recorded as stopped
    (run_group kills its process group on the way out), every cell left as not run, and
    every stage's files are written; exit 1. The signal is delivered by calling the
    handler the run installed, as Python does when the signal arrives."""
    def term(cell) -> None:
        if cell.name == "tiny-auto-1gpu":
            handler = signal.getsignal(signal.SIGTERM)
            assert callable(handler)  # the run's, not the default
            handler(signal.SIGTERM, None)

    ran: list[str] = []
    monkeypatch.setattr(gpu, "run_cell", fake_cells(ran, term))
    before = signal.getsignal(signal.SIGTERM)
    assert bench_main(["gpu", "xl", "speedrun", "--smoke", "--out", str(tmp_path)]) == 1
    assert signal.getsignal(signal.SIGTERM) == before  # put back
    assert ran == ["tiny-fsdp-ac-1gpu", "tiny-auto-1gpu"]
    xl = json.loads((tmp_path / "gpu_xl.json").read_text())["cells"]
    assert [c["status"] for c in xl] == ["skipped", "stopped"]
    assert xl[1]["reason"].startswith("stopped by SIGTERM after ")
    for cell in json.loads((tmp_path / "gpu_speedrun.json").read_text())["cells"]:
        assert cell["status"] == "skipped"
        assert cell["reason"].startswith("not run: the invocation was stopped (SIGTERM) at ")
    assert (tmp_path / "gpu_speedrun.md").is_file()


def test_a_missing_optional_package_skips_its_cells_not_the_call(tmp_path, capsys, monkeypatch) -> None:
    """torchao missing (the GPU machines' image lacks it) and no wheel: each FP8 cell is
    skipped with the reason, the bf16 cells beside them run; the run says so once."""
    monkeypatch.setattr(gpu_inputs, "importable", lambda module: module != "torchao")
    missing = gpu_inputs.prepare(cells_of("fp8"), None, tmp_path / "site")
    assert set(missing.missing) == {"torchao"}
    for cell in gpu_stages.stage_cells("fp8", gpu_stages.FULL, NOWHERE):
        record = gpu.run_cell(cell, 60, gpu_stages.FULL, gpu.make_tokens(10, 10), None, tmp_path,
                              None, missing) if cell.params["fp8"] != "off" else None
        if record is not None:
            assert record["status"] == "skipped" and record["reason"] == missing.missing["torchao"]
    monkeypatch.setattr(gpu, "run_cell", fake_cells(ran := []))
    assert bench_main(["gpu", "fp8", "--smoke", "--out", str(tmp_path / "out")]) == 0
    assert "torchao: torchao is not importable and no --wheels DIR was given" in capsys.readouterr().out
    assert ran  # the stage ran


def test_fp8_at_xl_fused_compile_and_loss_bench_cells_are_these_command_lines() -> None:
    full = gpu_stages.FULL
    names = [c.name for c in gpu_stages.stage_cells("fp8", full, NOWHERE)]
    assert names[3:] == ["gpt2-xl-auto-1gpu", "gpt2-xl-auto-1gpu-fp8-tensorwise"]
    bf16, fp8 = gpu_stages.stage_cells("fp8", full, NOWHERE)[3:]
    # the xl stage's own cell: measured once in an invocation that runs both
    assert gpu_stages.same_command(bf16) == gpu_stages.same_command(gpu_stages.stage_cells("xl", full, NOWHERE)[1])
    assert argv_of(fp8).endswith("--parallel auto --activation-checkpointing auto --fp8 tensorwise "
                                 "--warmup-steps 10 --compile-mode default")
    assert fp8.params["fp8"] == "tensorwise" and fp8.estimate_s > bf16.estimate_s
    cells = gpu_stages.stage_cells("fused-compile", full, NOWHERE)
    assert [c.name for c in cells] == [
        "ours-b64-default-cap15", "ours-b64-default-fused-cap15",
        "ours-b64-reduce-overhead-fused-cap15", "ours-b64-max-autotune-fused-cap15"]
    assert all("--logit-softcap 15" in argv_of(c) and c.params["softcap"] == 15.0 for c in cells)
    assert argv_of(cells[2]).endswith("--compile-mode reduce-overhead")
    bench = gpu_stages.stage_cells("loss-kernels", full, NOWHERE)[0]
    assert bench.name == "loss-bench" and bench.kind == "loss-bench"
    assert bench.cmd[1:3] == ["-m", "gpt.bench.gpu.loss_bench"] and "--rows" in bench.cmd
    assert bench.cmd[bench.cmd.index("--rows") + 1] == str(64 * 1024)  # the 124M cells' micro-batch


def test_the_loss_bench_on_a_cpu_times_the_whole_logits_loss_and_skips_the_fused_modes(
        tmp_path, capsys) -> None:
    """gpt/bench/gpu/loss_bench.py as --smoke runs it: the whole logits' loss, without and
    with the cap, timed; the fused modes skipped with the reason (CUDA, or the
    interpreter: tests/model/test_fused_ce.py runs them there)."""
    from gpt.bench.gpu import loss_bench

    out = tmp_path / "loss_bench.json"
    assert loss_bench.main(["--out", str(out), "--device", "cpu", "--rows", "8", "--vocab", "50",
                            "--no-compile", "--warmup", "0", "--repeats", "2"]) == 0
    report = json.loads(out.read_text())
    assert (report["rows"], report["vocab"], report["compile_mode"]) == (8, 50, "eager")
    for v in report["variants"]:
        if v["variant"] == "compiled":
            assert v["status"] == "ok" and v["total_ms"] > 0 and v["traffic_logits"] == 3
        else:
            assert v["status"] == "skipped" and "CUDA" in v["reason"]
    per_cap = len(loss_bench.variants())  # the compiled loss, the backward mode, each launch
    # (one, skipped, where Triton is missing), expecting wrong
    assert per_cap == 3 + max(1, len(loss_bench.launch_names()))
    assert [v["softcap"] for v in report["variants"]] == [0.0] * per_cap + [15.0] * per_cap
    assert report["choice"]["launch"] is None  # nothing fused ran
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            loss_bench.main(["--out", str(out)])
        assert "--device cuda: no CUDA device here" in capsys.readouterr().err


# the priority order: the loss launches and modes against the compiled loss and
# Liger, ours against build-nanogpt at micro-batch 64, the CUDA tests, XL, FP8
PREPARED_CELLS = ["loss-bench", "ours-b64-default", "ours-b64-default-liger", "ours-b64-default-fused",
                  "ours-b64-default-fused-forward", "build-nanogpt-b64", "pytest-cuda",
                  "gpt2-xl-auto-1gpu", "ours-b64-default-fp8-tensorwise",
                  "gpt2-xl-auto-1gpu-fp8-tensorwise"]


def doc_command(start: str) -> list[str]:
    """The command of benchmarks/gpu/README.md's code that starts with `start`, its
    continued lines joined."""
    lines = DOC.read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if start in line)
    words = lines[i][lines[i].index(start):].rstrip("\\").split()
    while lines[i].endswith("\\"):
        i += 1
        words += lines[i].rstrip("\\").split()
    return words


def planned(capsys, command: list[str]) -> tuple[list[dict], float]:
    """The plan (--plan --json) of a documented call: its cells, and its budget."""
    stages = command[4:command.index("--budget")]
    budget = float(command[command.index("--budget") + 1])
    only = command[command.index("--only") + 1:]
    assert bench_main(["gpu", "--plan", *stages, "--budget", str(budget), "--only", *only, "--json"]) == 0
    return [c for s in json.loads(capsys.readouterr().out)["stages"] for c in s["cells"]], budget


def test_the_prepared_call_runs_its_cells_in_priority_order_within_its_budget(capsys, monkeypatch) -> None:
    """benchmarks/gpu/README.md's prepared call (8 minutes of an H100 or H200): its cells
    in the priority order; by the estimates (--plan), the loss cells and build-nanogpt fit
    its --budget, and what does not waits for a faster run or the second call, as the guide
    says, with the figures it quotes; the second call runs what the first skips."""
    refuse_to_run(monkeypatch)
    command = doc_command("python -m gpt.bench gpu loss-kernels throughput cuda-tests xl fp8")
    assert command[4:command.index("--budget")] == ["loss-kernels", "throughput", "cuda-tests", "xl", "fp8"]
    assert command[command.index("--only") + 1:] == PREPARED_CELLS
    assert float(command[command.index("--budget") + 1]) <= 480  # 8 minutes
    cells, budget = planned(capsys, command)
    run = [c["name"] for c in cells if not c.get("same_as")]
    # in order; the fp8 stage's bf16 124M cell is the loss cells' first, its XL one the xl
    # stage's, planned again as that one would not fit
    assert run == [*PREPARED_CELLS[:9], "gpt2-xl-auto-1gpu", PREPARED_CELLS[9]]
    fits = [c["name"] for c in cells if c["fits"] and not c.get("same_as")]
    assert fits == PREPARED_CELLS[:6]
    used = sum(c["estimate_s"] for c in cells if c["fits"])
    by_name = {c["name"]: c["estimate_s"] for c in cells if not c.get("same_as")}
    doc = " ".join(DOC.read_text().split())
    assert f"{used} s of the {budget - gpu_plan.RESERVE_S:.0f} the budget leaves its cells" in doc
    assert (f"the CUDA tests ({by_name['pytest-cuda']} s), XL ({by_name['gpt2-xl-auto-1gpu']} s: "
            "five layout plans and XL's compile) and FP8 would not") in doc
    second = doc_command("python -m gpt.bench gpu cuda-tests xl fp8 --budget")
    assert second[second.index("--only") + 1:] == ["pytest-cuda", "gpt2-xl-auto-1gpu", "ours-b64-default",
                                                   "ours-b64-default-fp8-tensorwise",
                                                   "gpt2-xl-auto-1gpu-fp8-tensorwise"]
    cells, _ = planned(capsys, second)
    assert [c["name"] for c in cells if c["fits"] and not c.get("same_as")] == [
        "pytest-cuda", "gpt2-xl-auto-1gpu", "ours-b64-default"]


# ---------------------------------------------------------------------------------------
# the stages in --smoke mode


def run_stage(stage: str, out: Path, *flags: str) -> dict:
    assert bench_main(["gpu", stage, "--smoke", "--out", str(out), *flags]) == 0
    report = json.loads((out / f"gpu_{stage}.json").read_text())
    assert report["schema"] == gpu.SCHEMA and report["stage"] == stage and report["smoke"]
    assert {"device", "torch", "cuda", "commit", "peak_tflops"} <= report["env"].keys()
    assert report["command"] == " ".join(["python -m gpt.bench gpu", stage, "--smoke", "--out", str(out),
                                          *flags])
    assert (out / f"gpu_{stage}.md").read_text().startswith(f"# GPU acceptance, stage {stage}")
    assert (out / f"gpu_{stage}.log").is_file()
    assert report["comparison"] == []  # build-nanogpt does not run in --smoke
    for key in ("loss_comparison", "fp8_comparison", "recipe_comparison"):
        assert isinstance(report[key], list)
    for cell in report["cells"]:
        assert CELL_KEYS <= cell.keys()
        assert cell["status"] in ("ok", "skipped"), cell
        if cell["kind"] == "trainer" and cell["status"] == "ok":
            assert "--no-save-checkpoints" in cell["command"]
            assert cell["memory"]["measured_peak_bytes"] > 0 and cell["memory"]["planner"]
    return {c["name"]: c for c in report["cells"]}


@pytest.mark.slow
def test_cuda_tests_smoke(tmp_path: Path) -> None:
    tests = run_stage("cuda-tests", tmp_path)["pytest-cuda"]["result"]
    assert tests["tests"] >= 10 and tests["skipped"] == tests["tests"]  # no GPU here
    # each test's seconds, by the names the estimates use: the next GPU run's measurements
    from gpt.bench.gpu.estimates import CUDA_TESTS

    assert set(CUDA_TESTS) <= set(tests["durations_s"])


@pytest.mark.slow
def test_throughput_smoke(tmp_path: Path) -> None:
    cells = run_stage("throughput", tmp_path)
    assert list(cells) == ["ours-b8-default", "build-nanogpt-b8", "ours-b4-default", "build-nanogpt-b4",
                           "ours-b2-default", "build-nanogpt-b2"]
    train = cells["ours-b8-default"]["result"]
    assert FIGURES <= train.keys() and train["step_ms"]["n"] == SMOKE.steps - WARMUP
    assert train["peak_mem_gb"] > 0 and train["peak_mem_source"] == "peak RSS"
    assert cells["build-nanogpt-b8"]["status"] == "skipped" and "--smoke" in cells["build-nanogpt-b8"]["reason"]


@pytest.mark.slow
def test_xl_and_profile_smoke(tmp_path: Path) -> None:
    cells = run_stage("xl", tmp_path)
    xl = cells["tiny-fsdp-ac-1gpu"]
    assert xl["command"].split()[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert FIGURES <= xl["result"].keys()
    # the layout the trainer chose itself: one process, its own plan beside the measured peak
    auto = cells["tiny-auto-1gpu"]
    assert "torch.distributed.run" not in auto["command"] and FIGURES <= auto["result"].keys()
    layout = auto["result"]["layout"]
    assert layout["source"] == "planned" and layout["parallel"] == "ddp"
    assert sorted(layout["auto"]) == ["activation_checkpointing", "batch_size", "parallel"]
    assert auto["result"]["grad_accum"] * layout["batch_size"] == 4 * SMOKE.xl_batch
    memory = auto["memory"]
    assert memory["predicted_peak_bytes"] == layout["planned_peak_bytes"] > 0
    assert memory["measured_over_predicted"] > 0
    cells = run_stage("profile", tmp_path)
    assert list(cells) == ["ours-b8-default-profile", "tiny-fsdp-ac-1gpu-profile"]
    for cell in cells.values():
        assert "--torch-profile" in cell["command"] and FIGURES <= cell["result"].keys()
        profile = cell["result"]["profile"]
        assert profile["steps"] == gpu_stages.PROFILED_STEPS and profile["device"] == "cpu"


@pytest.mark.slow
def test_max_autotune_ladder_and_tokens_smoke(tmp_path: Path) -> None:
    cells = run_stage("max-autotune", tmp_path)
    assert FIGURES <= cells["ours-b8-max-autotune"]["result"].keys()
    rungs = run_stage("ladder", tmp_path)["ladder-tiny"]["result"]["results"]
    assert rungs[0]["status"] == "ok" and rungs[-1]["title"] == "trainer full default"
    result = run_stage("tokens", tmp_path)["tokens-tiny"]["result"]
    assert [r["label"] for r in result["runs"]] == ["gpt2 cosine", "gpt2 trapezoid", "new", "new",
                                                    "new, tied head", "new, tied head"]


@pytest.mark.slow
def test_loss_kernels_smoke(tmp_path: Path) -> None:
    cells = run_stage("loss-kernels", tmp_path)
    bench = cells.pop("loss-bench")
    variants = bench["result"]["variants"]
    assert [(v["variant"], v["softcap"]) for v in variants if v["status"] == "ok"] == [
        ("compiled", 0.0), ("compiled", 15.0)]  # the fused modes are CUDA's
    assert all(v["forward_ms"] > 0 for v in variants if v["status"] == "ok")
    assert "| - fused-forward 32w-8192-l2, cap 15 | skipped" in (tmp_path / "gpu_loss-kernels.md").read_text()
    assert [c["params"]["loss"] for c in cells.values()] == ["default", "liger", "cce", "fused",
                                                            "fused-forward"]
    assert cells["ours-b8-default"]["status"] == "ok"
    for name, kernel in (("ours-b8-default-liger", "liger"), ("ours-b8-default-cce", "cce"),
                         ("ours-b8-default-fused", "fused"),
                         ("ours-b8-default-fused-forward", "fused-forward")):
        assert cells[name]["status"] == "skipped" and "command" not in cells[name]
        assert cells[name]["reason"] == f"--smoke: --loss-kernel {kernel} runs Triton kernels on CUDA only"
    report = json.loads((tmp_path / "gpu_loss-kernels.json").read_text())
    assert report["loss_comparison"] == []  # the skipped kernels have none
    assert "| ours-b8-default | ok" in (tmp_path / "gpu_loss-kernels.md").read_text()


@pytest.mark.slow
def test_fp8_and_speedrun_smoke(tmp_path: Path) -> None:
    for stage in ("fp8", "fp8-loss"):
        cells = run_stage(stage, tmp_path)
        fp8 = [c for c in cells.values() if c["params"]["fp8"] != "off"]
        bf16 = [c for c in cells.values() if c["params"]["fp8"] == "off"]
        assert len(bf16) == {"fp8": 2, "fp8-loss": 1}[stage] and fp8  # fp8: at 124M and XL
        assert all(c["status"] == "ok" for c in bf16)
        assert all(c["status"] == "skipped" and "--fp8" in c["reason"] for c in fp8)
    cells = run_stage("speedrun", tmp_path)
    assert list(cells) == ["recipe-gpt2-b8", "recipe-speedrun-b8"]
    [c] = json.loads((tmp_path / "gpu_speedrun.json").read_text())["recipe_comparison"]
    assert (c["cell"], c["recipe"], c["ours"]) == ("recipe-speedrun-b8", "speedrun", "recipe-gpt2-b8")
    assert "max_abs_loss_diff" not in c  # two recipes: their losses are not compared step by step


# ---------------------------------------------------------------------------------------
# a cell's process group


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie is dead, waiting for its (new) parent to reap it


# The cell's first process starts a grandchild that ignores SIGTERM, then sleeps (timeout) or
# exits at once (leaving the grandchild behind, its pipes closed).
LEADER = textwrap.dedent('''
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(float(sys.argv[2]))
''')


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to see the grandchild")
@pytest.mark.parametrize("leader_s,status", [(120, "timeout"), (0, "failed")])
def test_a_cell_leaves_no_process_behind(leader_s: float, status: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "KILL_GRACE_S", 1.0)
    pid_file = tmp_path / "pid"
    cell = gpu_stages.Cell("group", "pytest", 1, [sys.executable, "-c", LEADER, str(pid_file), str(leader_s)])
    (tmp_path / "group").mkdir()
    with open(tmp_path / "log", "w") as log:
        record = gpu.run_cell(cell, 5, SMOKE, gpu.make_tokens(10, 10), None, tmp_path, log)
    assert record["status"] == status, record
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild)
    if status == "timeout":
        assert "process group was killed" in record["reason"] and record["seconds"] < 30


def test_without_a_budget_a_cell_is_stopped_only_when_hung() -> None:
    cell = gpu_stages.ours_cell(gpu_stages.FULL, NOWHERE, 64)
    assert gpu.cell_limit(cell, None, smoke=False) == max(600, 5 * cell.estimate_s)
    # under a budget: what is left of it (the reserve already taken off), never more
    assert gpu.cell_limit(cell, 30.0, smoke=False) == 30.0 and gpu.cell_limit(cell, 400.0, False) == 400.0
