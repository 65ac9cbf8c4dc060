"""The GPU acceptance run's figures (gpt/bench/gpu/results.py) and its build-nanogpt
harness (gpt/bench/gpu/nanogpt.py), on the CPU: trainer cells write no checkpoint and record
the memory planner's prediction beside the measured peak; build-nanogpt's script (a
stand-in written here in the shape of the real one) is patched, run with GPT-2's BPE files
from this package where tiktoken's cache lacks them, and parsed, and its figures make the
ours / baseline column; each variant is compared with its baseline in the same stage (the
loss kernels, FP8 with its losses step by step, the recipes); the summary stays a table."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt.bench.gpu import accept as gpu
from gpt.bench.gpu import nanogpt
from gpt.bench.gpu import results as gpu_results
from gpt.bench.gpu import stages as gpu_stages
from gpt.bench.gpu.estimates import WARMUP
from gpt.data.shards import write_shard
from gpt.data.tokenizer import ASSETS

SMOKE = gpu_stages.Sizes.make(smoke=True)
ENV = {"device": "cpu", "torch": "t", "cuda": None, "commit": "x"}


def fake_planner(calls: list) -> types.ModuleType:
    module = types.ModuleType("gpt.plan.memory")

    def plan(cfg, world_size: int = 1, device_type: str = "cuda") -> types.SimpleNamespace:
        calls.append((cfg, world_size, device_type))
        return types.SimpleNamespace(peak_bytes=2**30 * cfg.model.n_layer,
                                     components={"params": 2**10, "activations": 2**19})

    module.plan = plan
    return module


@pytest.mark.slow
def test_a_trainer_cell_writes_no_checkpoint_and_records_predicted_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    monkeypatch.setitem(sys.modules, "gpt.plan.memory", fake_planner(calls))
    tokens = gpu.make_tokens(50_000, 5_000)
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "train_000000.bin", tokens[0])
    write_shard(data / "val_000000.bin", tokens[1])
    cell = gpu_stages.ours_cell(SMOKE, gpu_stages.Where(data, tmp_path / "runs", tmp_path), 8)
    with open(tmp_path / "log", "w") as log:
        record = gpu.run_cell(cell, 300, SMOKE, tokens, None, tmp_path, log)
    assert record["status"] == "ok", record
    out = Path(cell.params["out"])
    assert (out / "metrics.jsonl").is_file() and not list(out.glob("ckpt_*"))
    [(cfg, world_size, device_type)] = calls
    assert (cfg.model.n_layer, cfg.data.batch_size, world_size, device_type) == (2, 8, 1, "cpu")
    assert not cfg.checkpoint.save_checkpoints
    mem = record["memory"]
    assert mem["planner"] == "gpt.plan.memory.plan" and mem["predicted_peak_bytes"] == 2 * 2**30
    assert mem["components"] == {"params": 2**10, "activations": 2**19}
    assert mem["measured_peak_bytes"] == round(record["result"]["peak_mem_gb"] * 2**30)
    assert mem["measured_over_predicted"] == pytest.approx(mem["measured_peak_bytes"] / 2**31)
    report = {"stage": "throughput", "smoke": True, "seconds": 1, "budget_s": None, "command": "c",
              "cells": [record], "env": ENV}
    [row] = [line for line in gpu_results.summary(report).splitlines() if line.startswith("| ours-b8")]
    assert f"({2.0:.2f}, {mem['measured_over_predicted']:.2f})" in row


def test_without_the_planner_the_reason_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    cell = gpu_stages.ours_cell(SMOKE, gpu_stages.Where(Path("/d"), Path("/w"), Path("/t")), 8)
    monkeypatch.setitem(sys.modules, "gpt.plan.memory", None)  # import gpt.plan.memory raises ImportError
    mem = gpu_results.predicted_memory(cell)
    assert mem["predicted_peak_bytes"] is None and mem["planner"].startswith("planner unavailable: ")
    report = {"stage": "throughput", "smoke": True, "seconds": 1, "budget_s": 1, "command": "c",
              "cells": [{"name": "ours-b8-default", "kind": "trainer", "params": {}, "status": "failed",
                         "memory": mem, "reason": "exit 1"}], "env": ENV}
    assert f"No prediction: {mem['planner']}" in gpu_results.summary(report)
    broken = types.ModuleType("gpt.plan.memory")
    broken.plan = lambda cfg, world_size=1, device_type="cuda": 1 / 0
    monkeypatch.setitem(sys.modules, "gpt.plan.memory", broken)
    mem = gpu_results.predicted_memory(cell)
    assert mem["predicted_peak_bytes"] is None
    assert mem["planner"].startswith("planner failed: ZeroDivisionError")
    assert gpu_results.with_measured(mem, {"peak_mem_gb": 1.0, "peak_mem_source": "peak RSS"}) == {
        **mem, "measured_peak_bytes": 2**30, "measured_source": "peak RSS", "measured_over_predicted": None}


# ---------------------------------------------------------------------------------------
# build-nanogpt

# A stand-in with the lines the harness substitutes, which fails if a substitution did not
# happen, loads GPT-2's encoding through tiktoken as the real script does, and prints its
# per-step line in build-nanogpt's format.
STAND_IN = textwrap.dedent('''
    import os
    import numpy as np
    import tiktoken
    from hellaswag import render_example, iterate_examples
    total_batch_size = 524288 # 2**19, ~0.5M, in number of tokens
    B = 64 # micro batch size
    max_steps = 19073 # 19,073 steps is ~1 epoch
    warmup_steps = 715
    use_compile = False # torch.compile interferes
    last_step = False
    assert tiktoken.get_encoding("gpt2").encode("Hello") == [15496]
    tokens = np.load(os.path.join("edu_fineweb10B", "edufineweb_train_000000.npy"))
    assert use_compile and render_example is None and B == 4 and total_batch_size == 1024
    assert warmup_steps == 10  # the trainer cells' warm-up
    for step in range(max_steps):
        if step % 250 == 0 or last_step:
            raise SystemExit("validation must be off")
        loss = 10.0 - step / 10 + tokens[step] / 1e9
        print(f"step {step:5d} | loss: {loss:.6f} | lr 6.0000e-04 | norm: 1.0000 | dt: {100.0 + step:.2f}ms | tok/sec: {total_batch_size / 0.1:.2f}")
''')
SIZES = gpu_stages.Sizes(smoke=False, model="gpt2", seq_len=1024, batches=(4,), steps=WARMUP + 5,
                       tokens_per_step=1024, xl_model="gpt2-xl", xl_batch=1, loss_steps=8)


def test_build_nanogpt_harness_runs_offline_parses_and_makes_the_ratio(tmp_path: Path, monkeypatch) -> None:
    """Its script named as a file; tiktoken's cache empty and downloads impossible: the
    harness gives it this package's copies of GPT-2's BPE files."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # a download would fail at once
    script = tmp_path / "bng" / "train_gpt2.py"
    script.parent.mkdir()
    script.write_text(STAND_IN)
    cell = gpu_stages.nanogpt_cell(SIZES, 4)
    tokens = gpu.make_tokens(10_000, 1_000)
    with open(tmp_path / "log", "w") as log:
        record = gpu.run_cell(cell, 120, SIZES, tokens, script, tmp_path, log)
    assert record["status"] == "ok", record
    r = record["result"]
    assert r["steps_logged"] == SIZES.steps and r["step_ms"]["median"] == 105.0
    assert r["losses"][0] == pytest.approx(10.0 + tokens[0][0] / 1e9)
    saved = np.load(tmp_path / "build-nanogpt-b4" / nanogpt.DATA_FOLDER / "edufineweb_val_000000.npy")
    assert np.array_equal(saved, tokens[1])  # the same tokens the trainer reads
    # ours at the same micro-batch, 50 ms a step on the same tokens per step: 2.1x its speed
    steps = [{"ms": 50.0, "loss": 5.0}] * SIZES.steps
    ours = {"name": "ours-b4-default", "kind": "trainer", "status": "ok", "seconds": 9, "estimate_s": 9,
            "params": {"batch_size": 4, "model": "gpt2"},
            "result": gpu_results.step_figures(steps, 1024, "gpt2", 1024, "cpu")}
    other = {**ours, "name": "ours-b8-default", "params": {"batch_size": 8, "model": "gpt2"}}
    [c] = gpu_results.comparisons([ours, other, record])
    assert (c["cell"], c["baseline"], c["batch_size"]) == ("ours-b4-default", "build-nanogpt-b4", 4)
    assert c["ours_over_baseline"] == pytest.approx(105.0 / 50.0)
    assert c["losses_compared"] == SIZES.steps
    assert c["max_abs_loss_diff"] == pytest.approx(max(abs(5.0 - x) for x in r["losses"]))
    report = {"stage": "throughput", "smoke": False, "seconds": 1, "budget_s": None, "command": "c",
              "cells": [ours, other, record], "comparison": [c], "env": ENV}
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in gpu_results.summary(report).splitlines()
            if line.startswith("| ours") or line.startswith("| build")}
    assert rows["ours-b4-default"][5] == "2.100x"
    assert rows["ours-b8-default"][5] == "-" and rows["build-nanogpt-b4"][5] == "-"


def test_build_nanogpt_missing_or_changed_fails_the_cell(tmp_path: Path) -> None:
    cell = gpu_stages.nanogpt_cell(SIZES, 4)
    tokens = gpu.make_tokens(1_000, 100)
    record = gpu.run_cell(cell, 60, SIZES, tokens, tmp_path / "absent.py", tmp_path, None)
    assert record["status"] == "failed" and "github.com/karpathy/build-nanogpt" in record["reason"]
    (tmp_path / "train_gpt2.py").write_text(STAND_IN.replace("B = 64 # micro batch size", "B = 8"))
    record = gpu.run_cell(cell, 60, SIZES, tokens, tmp_path, tmp_path, None)  # its folder
    assert record["status"] == "failed" and "B = 64 # micro batch size" in record["reason"]


def test_tiktoken_env_adds_nothing_where_the_cache_has_the_files(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    env = nanogpt.tiktoken_env(tmp_path / "scratch")
    assert env == {"TIKTOKEN_CACHE_DIR": str(tmp_path / "scratch")}
    url = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for name in ("vocab.bpe", "encoder.json"):  # the files as tiktoken names and checks them
        copy = tmp_path / "scratch" / hashlib.sha1((url + name).encode()).hexdigest()
        assert copy.read_bytes() == (ASSETS / "gpt2" / name).read_bytes()
    done = subprocess.run([sys.executable, "-c", "import tiktoken; print(tiktoken.get_encoding('gpt2').n_vocab)"],
                          env={**os.environ, **env, "HTTPS_PROXY": "http://127.0.0.1:9"},
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "50257", done.stderr
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "scratch"))  # now it has them
    assert nanogpt.tiktoken_env(tmp_path / "other") == {}


# ---------------------------------------------------------------------------------------
# each variant against its baseline, and the summary


def trainer(name: str, ms: float, mem: float, *, batch: int = 64, status: str = "ok",
            losses: list[float] | None = None, **params: str) -> dict:
    steps = [{"ms": ms, "loss": x} for x in (losses or [5.0] * 8)]
    result = gpu_results.step_figures(steps, 2**17, "gpt2", 1024, "cpu")
    return {"name": name, "kind": "trainer", "status": status, "seconds": 9, "estimate_s": 9,
            "params": {"model": "gpt2", "batch_size": batch, "compile_mode": "default", "steps": 8,
                       "loss": "default", "fp8": "off", "recipe": "default", **params},
            "result": {**result, "peak_mem_gb": mem}}


def test_each_loss_kernel_against_the_whole_logits_in_the_summary() -> None:
    cells = [trainer("ours-b64-default", 400.0, 20.0),
             trainer("ours-b64-default-liger", 380.0, 18.0, loss="liger"),
             trainer("ours-b64-default-cce", 1.0, 1.0, status="failed", loss="cce"),
             trainer("ours-b16-default-liger", 100.0, 5.0, batch=16, loss="liger")]  # no base at 16
    found = gpu_results.loss_comparisons(cells)
    assert [c["cell"] for c in found] == ["ours-b64-default-liger"]
    liger = found[0]
    assert liger["ours"] == "ours-b64-default"
    assert liger["step_ms_over_ours"] == pytest.approx(0.95)
    assert liger["tokens_per_s_over_ours"] == pytest.approx(400 / 380)
    assert liger["peak_mem_over_ours"] == pytest.approx(0.9)
    report = {"stage": "loss-kernels", "smoke": False, "seconds": 1, "budget_s": 1, "command": "c",
              "cells": cells, "loss_comparison": found, "env": ENV}
    rows = [line for line in gpu_results.summary(report).splitlines()
            if line.startswith("| ours-b64-default-liger | liger")]
    assert rows == ["| ours-b64-default-liger | liger | 380.0 (0.950x) | 344,926 (1.053x) | 18.00 (0.900x) |"]


@pytest.mark.numerics
def test_the_loss_bench_judges_a_fused_variant_by_bf16s_rounding() -> None:
    """A fused variant's bf16 gradient one ulp from the compiled loss's, each entry (two
    fp32 values rounded to nearest land at most one bf16 ulp apart: 2^-7 of the value at
    most), is right; two ulps from it, or its loss 2e-3 off (a row in bf16, a row
    miscounted), or NaN, is wrong, with the reason; a rescaled one is allowed a rounding
    more. The choice takes the fastest launch judged right under every cap."""
    from gpt.bench.gpu import loss_bench

    g = torch.Generator().manual_seed(0)
    ref = (torch.randn(64, 300, generator=g) * 1e-3).bfloat16()
    loss = torch.tensor(10.8)
    bits = ref.view(torch.int16)

    def verdict(grad: torch.Tensor, got_loss: torch.Tensor, variant: str = "fused-forward") -> dict:
        row = {"variant": variant, "status": "ok", **loss_bench.distances(got_loss, grad, loss, ref)}
        loss_bench.judge(row, torch.bfloat16)
        return row

    one_ulp = (bits + 1).view(torch.bfloat16)  # the next bf16 away from zero, every entry
    two_ulps = bits.clone()
    two_ulps[5, 7] += 2
    assert verdict(ref, loss)["status"] == "ok"
    assert verdict(one_ulp, loss + 1e-4)["status"] == "ok"  # 1e-5 relative: fp32's differences
    wrong = verdict(two_ulps.view(torch.bfloat16), loss)
    assert wrong["status"] == "wrong" and wrong["reason"].startswith("a gradient entry ")
    assert verdict(two_ulps.view(torch.bfloat16), loss, loss_bench.WRONG)["status"] == "ok"
    assert verdict(ref, loss * (1 + 2e-3))["reason"].startswith("loss 0.002 from the compiled")
    nan = ref.clone()
    nan[40, 0] = float("nan")  # in the last of the row chunks below, too
    assert verdict(nan, loss)["status"] == "wrong"
    # a few rows at a time (the GPU's 13 GB fp32 copies kept small): the same figures
    for grad in (two_ulps.view(torch.bfloat16), nan):
        whole = loss_bench.distances(loss, grad, loss, ref)
        chunked = loss_bench.distances(loss, grad, loss, ref, rows=7)
        assert str(chunked) == str(whole)  # NaN included
    assert verdict(ref, torch.tensor(float("nan")))["status"] == "wrong"
    rows = [{"variant": v, "launch": launch, "softcap": cap, "status": status, "total_ms": ms}
            for v, launch, cap, status, ms in (
                ("compiled", None, 0.0, "ok", 9.0), ("compiled", None, 15.0, "ok", 10.0),
                ("fused-backward", None, 0.0, "ok", 7.0), ("fused-backward", None, 15.0, "ok", 8.0),
                ("fused-forward", "8w-4096", 0.0, "ok", 4.0),
                ("fused-forward", "8w-4096", 15.0, "wrong", 4.0),  # fastest, but wrong
                ("fused-forward", "32w-8192-l2", 0.0, "ok", 5.0),
                ("fused-forward", "32w-8192-l2", 15.0, "ok", 6.0))]
    choice = loss_bench.choose(rows)
    assert (choice["launch"], choice["mode"]) == ("32w-8192-l2", "forward")
    assert choice["mode_ms"] == {"forward": 11.0, "backward": 15.0} and choice["compiled_ms"] == 19.0


def test_the_loss_bench_says_what_it_judged_and_chose_in_the_summary() -> None:
    variants = [{"variant": "compiled", "softcap": 0.0, "status": "ok", "forward_ms": 4.0,
                 "backward_ms": 5.0, "total_ms": 9.0, "gb_per_s": 2000.0},
                {"variant": "fused-forward", "launch": "32w-8192-l2", "softcap": 0.0, "status": "ok",
                 "forward_ms": 4.5, "backward_ms": 0.01, "total_ms": 4.51, "gb_per_s": 2900.0,
                 "total_over_compiled": 0.5, "loss_rel_diff": 1e-6, "grad_max_rel_diff": 0.006,
                 "loss_tolerance": 1e-4, "grad_tolerance": 2 ** -7 + 1e-4},
                {"variant": "fused-forward, expected wrong", "launch": "32w-8192-l2", "softcap": 0.0,
                 "status": "wrong", "reason": "a gradient entry 0.5 from the compiled loss's, "
                 "tolerance 0.0119", "forward_ms": 4.5, "backward_ms": 2.0, "total_ms": 6.5,
                 "gb_per_s": 3000.0, "loss_rel_diff": 1e-6, "grad_max_rel_diff": 0.5,
                 "loss_tolerance": 1e-4, "grad_tolerance": 2 ** -7 + 1e-4 + 2 ** -8}]
    choice = {"over_softcaps": [0.0], "compiled_ms": 9.0, "launch": "32w-8192-l2",
              "launch_ms": {"32w-8192-l2": 4.51}, "mode": "forward",
              "mode_ms": {"forward": 4.51, "backward": None}}
    cell = {"name": "loss-bench", "kind": "loss-bench", "status": "failed", "params": {},
            "estimate_s": 60, "result": {"dtype": "bfloat16", "variants": variants, "choice": choice}}
    text = gpu_results.summary({"stage": "loss-kernels", "smoke": False, "seconds": 1,
                                "budget_s": None, "command": "c", "cells": [cell], "env": ENV})
    assert "| - fused-forward 32w-8192-l2, cap 0 | ok |" in text
    assert "loss 1.0e-06 (<= 1e-04), grad 6.0e-03 (<= 7.9e-03)" in text
    assert ("each fused variant judged against the compiled loss on the same bfloat16 logits: the "
            "loss within 1e-04 relative, each gradient entry within 0.00791 of itself (0.0118 where "
            "the forward mode rescales)") in text
    assert "1 right, 1 wrong; wrong: fused-forward, expected wrong 32w-8192-l2, cap 0: a gradient" in text
    assert "the forward mode's fastest right launch is 32w-8192-l2 (4.51 ms, the compiled loss 9.00 ms)" in text


def test_build_nanogpt_against_each_of_ours_the_invocation_measured() -> None:
    """The throughput stage's build-nanogpt at micro-batch 64 set beside ours at 64 from the
    invocation's earlier stages too (the loss kernels' cells: the whole logits, Liger's,
    the fused loss in each mode), the fastest marked and named in the summary; a cell the
    stage reused (same_as) counted once."""
    def nanogpt(ms: float) -> dict:
        steps = [{"ms": ms, "loss": 5.0}] * 8
        return {"name": "build-nanogpt-b64", "kind": "nanogpt", "status": "ok", "seconds": 9,
                "estimate_s": 9, "params": {"batch_size": 64, "steps": 8},
                "result": gpu_results.step_figures(steps, 2**17, "gpt2", 1024, "cpu")}

    earlier = [{**trainer("ours-b64-default", 266.0, 29.0), "stage": "loss-kernels"},
               {**trainer("ours-b64-default-liger", 279.0, 23.0, loss="liger"), "stage": "loss-kernels"},
               {**trainer("ours-b64-default-fused-forward", 258.0, 27.0, loss="fused-forward"),
                "stage": "loss-kernels"},
               {**trainer("ours-b64-default-fused", 1.0, 1.0, status="failed", loss="fused"),
                "stage": "loss-kernels"}]
    cells = [{**earlier[0], "same_as": "loss-kernels"}, nanogpt(272.0)]
    found = gpu_results.comparisons(cells, earlier)
    assert [(r["cell"], r.get("stage")) for r in found] == [
        ("ours-b64-default", None), ("ours-b64-default-liger", "loss-kernels"),
        ("ours-b64-default-fused-forward", "loss-kernels")]
    fastest = [r for r in found if r.get("fastest")]
    assert [r["cell"] for r in fastest] == ["ours-b64-default-fused-forward"]
    assert fastest[0]["ours_over_baseline"] == pytest.approx(272.0 / 258.0)
    report = {"stage": "throughput", "smoke": False, "seconds": 1, "budget_s": None, "command": "c",
              "cells": cells, "comparison": found, "env": ENV}
    text = gpu_results.summary(report)
    assert ("Ours against build-nanogpt at micro-batch 64, every cell of this invocation: "
            "ours-b64-default 1.023x; ours-b64-default-liger (loss-kernels) 0.975x; "
            "ours-b64-default-fused-forward (loss-kernels) 1.054x. The fastest: "
            "ours-b64-default-fused-forward (loss fused-forward), 1.054x") in " ".join(text.split())
    own = gpu_results.comparisons(cells)  # without the earlier stages: its own cells
    assert [(r["cell"], r.get("fastest")) for r in own] == [("ours-b64-default", True)]


def test_fp8_against_bf16_with_its_losses_step_by_step() -> None:
    bf16 = [4.0 - i / 10 for i in range(8)]
    fp8 = [x + (0.01 if i < 6 else 0.03) for i, x in enumerate(bf16)]  # the last quarter: +0.03
    cells = [trainer("loss-gpt2-bf16", 300.0, 20.0, losses=bf16),
             trainer("loss-gpt2-fp8-tensorwise", 240.0, 16.0, losses=fp8, fp8="tensorwise"),
             trainer("ours-b64-default-fp8-rowwise", 250.0, 16.0, batch=32, fp8="rowwise")]  # no bf16 at 32
    found = gpu_results.comparisons_of(cells)
    assert found["loss_comparison"] == found["recipe_comparison"] == found["comparison"] == []
    [c] = found["fp8_comparison"]
    assert (c["cell"], c["fp8"], c["ours"]) == ("loss-gpt2-fp8-tensorwise", "tensorwise", "loss-gpt2-bf16")
    assert c["tokens_per_s_over_ours"] == pytest.approx(300 / 240) and c["losses_compared"] == 8
    assert c["max_abs_loss_diff"] == pytest.approx(0.03)
    assert c["last_quarter_mean_loss_diff"] == pytest.approx(0.03)
    assert c["mean_loss_diff"] == pytest.approx((6 * 0.01 + 2 * 0.03) / 8)
    report = {"stage": "fp8-loss", "smoke": False, "seconds": 1, "budget_s": None, "command": "c",
              "cells": cells, **found, "env": ENV}
    text = gpu_results.summary(report)
    assert "FP8 matmuls against bf16" in text
    assert "| loss-gpt2-fp8-tensorwise | tensorwise | 240.0 (0.800x) | 546,133 (1.250x) | 16.00 (0.800x) " \
           "| 8 | 0.0300 | +0.0300 |" in text
    assert gpu_results.loss_agreement([], []) == {"losses_compared": 0, "max_abs_loss_diff": None,
                                                  "mean_loss_diff": None,
                                                  "last_quarter_mean_loss_diff": None}


def test_a_reason_with_a_pipe_keeps_the_summary_a_table() -> None:
    """A failed cell's reason joins its last lines with ' | ': escaped in the markdown
    (unescaped, they split the row into more cells than the header has)."""
    report = {"stage": "throughput", "smoke": True, "seconds": 1, "budget_s": 1, "command": "c",
              "cells": [{"name": "ours-b8-default", "kind": "trainer", "params": {},
                         "status": "failed", "reason": "exit 1: first | second"}], "env": ENV}
    table = [line for line in gpu_results.summary(report).splitlines() if line.startswith("|")]
    cells = [line.replace("\\|", "").count("|") for line in table]
    assert len(set(cells)) == 1 and "first \\| second" in table[-1]
