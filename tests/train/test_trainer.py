"""The trainer: accumulation maths, overfitting a batch, end-to-end CLI runs and errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gpt.checkpoint.files import load
from gpt.core.cli import parse_args
from gpt.core.config import ConfigError, OptimConfig, model_preset
from gpt.core.config_io import from_dict
from gpt.data.loader import ShardLoader
from gpt.data.shards import write_shard
from gpt.engine.step import forward_backward, optimizer_step
from gpt.model.transformer import GPT, unwrap
from gpt.optim.optimizer import build_optimizer
from gpt.runtime.device import pick_device, resolve_dtype

from helpers import QUIET, TINY, TINY_RUN, read_metrics, run_cli


def grads_after_step(data: Path, batch_size: int, accum: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=16))
    opt, _ = build_optimizer(model, OptimConfig(), torch.device("cpu"))
    loader = ShardLoader(data, "train", batch_size, 16)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    # lr 0 leaves the weights alone, so the gradients left behind are those of the batch.
    _, norm = forward_backward(model, scaler, opt, loader, accum, 0.0, "cpu", torch.float32)
    optimizer_step(opt, scaler, 0.0, norm)
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.numerics
def test_accumulated_micro_batches_equal_one_big_batch(random_data_dir: Path) -> None:
    # B=8 in one pass, and B=2 over 4 micro-steps, read the same 8 rows of the stream.
    big = grads_after_step(random_data_dir, batch_size=8, accum=1)
    small = grads_after_step(random_data_dir, batch_size=2, accum=4)
    for name in big:
        torch.testing.assert_close(small[name], big[name], rtol=1e-4, atol=1e-6, msg=name)
    assert any(g.abs().sum() > 0 for g in big.values())


@pytest.mark.slow
def test_overfits_one_batch_of_shakespeare(shakespeare_tokens: np.ndarray) -> None:
    B, T = 2, 64
    buf = torch.from_numpy(shakespeare_tokens[1 : B * T + 2].astype(np.int64))
    x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
    torch.manual_seed(0)
    model = GPT(model_preset("mini", block_size=T))
    opt, _ = build_optimizer(model, OptimConfig(max_lr=1e-3, weight_decay=0.0), torch.device("cpu"))
    losses = []
    for _ in range(50):
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert 10.5 < losses[0] < 11.2  # ~ln(50304) at init
    assert losses[-1] < 0.5, losses[::10]


def test_unwrap_strips_wrapper_prefixes() -> None:
    model = GPT(model_preset("tiny", block_size=16))
    wrapped = torch.compile(model)  # wrapping alone adds `_orig_mod.`; nothing is compiled
    assert any(k.startswith("_orig_mod.") for k in wrapped.state_dict())
    keys = unwrap(wrapped).state_dict().keys()
    assert keys == model.state_dict().keys()


def test_device_and_precision_choice_on_cpu() -> None:
    assert pick_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert pick_device("auto").type in ("cpu", "mps")
        with pytest.raises(ConfigError, match="--device cuda"):
            pick_device("cuda")
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) is torch.float32
    assert resolve_dtype("bf16", cpu) is torch.bfloat16
    with pytest.raises(ConfigError, match="--dtype fp16"):
        resolve_dtype("fp16", cpu)


@pytest.mark.slow
def test_cli_end_to_end_on_shakespeare(shakespeare_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(*TINY, "--data-dir", str(shakespeare_dir), "--out-dir", str(out),
                   "--max-steps", "12", "--val-every", "5", "--val-steps", "2",
                   "--sample-every", "10", "--sample-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    assert "grad accum 2 x 4 x 32" in proc.stdout
    records = read_metrics(out)
    kinds = [r["type"] for r in records]
    assert kinds[0] == "run" and kinds.count("train") == 12
    assert kinds.count("val") == 4  # steps 0, 5, 10 and the last
    assert kinds.count("sample") == 2  # step 10 and the last
    train = [r for r in records if r["type"] == "train"]
    assert [r["step"] for r in train] == list(range(12))
    assert train[-1]["loss"] < train[0]["loss"] - 0.5  # it learns
    assert all(r["tokens_per_s"] > 0 and r["ms"] > 0 for r in train)
    # On CPU the memory figure is the process's peak RSS, and the header says so.
    assert records[0]["peak_mem_source"] == "peak RSS" and all(r["peak_mem_gb"] > 0 for r in train)
    assert all(" GiB" in line for line in proc.stdout.splitlines() if line.startswith("step") and "| loss" in line)
    # Progress: tokens seen so far, time since start and an estimate to --max-steps.
    assert [r["tokens_seen"] for r in train] == [256 * (i + 1) for i in range(12)]
    assert train[-1]["eta_s"] == 0 and train[0]["eta_s"] > 0 and train[-1]["elapsed_s"] > 0
    assert "12/12 steps in" in proc.stdout and "ETA" in proc.stdout
    assert records[0]["grad_accum"] == 2 and records[0]["params"] > 0
    ckpt = load(out / "ckpt_000012.pt")  # weights_only=True inside
    assert ckpt["step"] == 12
    cfg = from_dict(ckpt["config"])
    assert cfg.model.n_layer == 2 and cfg.data.batch_size == 4
    model = GPT(cfg.model)
    model.load_state_dict(ckpt["model"])  # no wrapper prefixes, every key present
    assert ckpt["optimizer"]["state"]  # the optimizer state is there to resume from
    assert (out / "config.toml").is_file()
    # The saved config.toml reproduces the run's config.
    assert parse_args(["--config", str(out / "config.toml")]) == cfg


@pytest.mark.slow
def test_cli_bf16_autocast_on_cpu_without_val_or_samples(random_data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(*TINY, "--data-dir", str(random_data_dir), "--out-dir", str(out),
                   "--max-steps", "3", *QUIET, "--dtype", "bf16", "--log-every", "2")
    assert proc.returncode == 0, proc.stderr
    assert "precision bf16" in proc.stdout
    assert [r["step"] for r in read_metrics(out, "train")] == [0, 2]
    assert (out / "ckpt_000003.pt").is_file()


def test_cli_batch_that_does_not_divide(random_data_dir: Path, tmp_path: Path) -> None:
    proc = run_cli("--model", "tiny", "--data-dir", str(random_data_dir),
                   "--out-dir", str(tmp_path / "r"), "--batch-size", "3", "--seq-len", "32",
                   "--block-size", "32", "--total-batch-tokens", "1000", "--device", "cpu")
    assert proc.returncode == 2
    assert "--total-batch-tokens 1000 is not divisible" in proc.stderr
    assert "96" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_missing_data_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    proc = run_cli(*TINY, "--data-dir", str(missing), "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 1
    assert str(missing) in proc.stderr and "Traceback" not in proc.stderr


def test_cli_corrupt_shard_is_named(random_data_dir: Path, tmp_path: Path) -> None:
    bad = random_data_dir / "train_000001.bin"
    write_shard(bad, np.arange(100))
    bad.write_bytes(bad.read_bytes()[:-10])  # truncate
    proc = run_cli(*TINY, "--data-dir", str(random_data_dir), "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 1
    assert str(bad) in proc.stderr and "Traceback" not in proc.stderr


def test_cli_unwritable_out_dir(random_data_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run_cli(*TINY, "--data-dir", str(random_data_dir), "--out-dir", str(blocker / "run"))
    assert proc.returncode == 2
    assert "--out-dir" in proc.stderr and "Traceback" not in proc.stderr
    assert blocker.read_text() == "not a folder"


def test_out_of_memory_names_the_flag(monkeypatch, data_dir: Path, tmp_path: Path, capsys) -> None:
    from gpt.entry import train_main
    import gpt.train.loop as train_mod

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(train_mod, "forward_backward", oom)
    code = train_main([*TINY_RUN, "--max-steps", "2", "--data-dir", str(data_dir),
                           "--out-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 1 and "out of memory" in err and "lower --batch-size" in err
    assert "python -m gpt.bench memory" in err  # the planner says what fits
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_rejects_unknown_flag_and_bad_value() -> None:
    proc = run_cli("--max-stesp", "10")
    assert proc.returncode == 2 and "--max-steps" in proc.stderr  # suggestion
    proc = run_cli("--seq-len", "2048")
    assert proc.returncode == 2 and "--seq-len 2048 exceeds the model's --block-size 1024" in proc.stderr


@pytest.mark.slow
def test_fine_tune_from_hf_folder_with_hellaswag(random_data_dir: Path, tmp_path: Path) -> None:
    """--init-from a local HF GPT-2 folder (shape and weights from it), HellaSwag during training."""
    import json

    from gpt.checkpoint.export import export_hf

    torch.manual_seed(3)
    source = GPT(model_preset("tiny", n_layer=3, block_size=32))
    export_hf(source, tmp_path / "hf")
    hs = tmp_path / "hs.jsonl"
    rows = [{"ctx": f"The cat sat on the mat number {i}.", "label": i % 4,
             "endings": ["and slept.", "and ate a fish.", "then it left the room quietly.", "!"]}
            for i in range(6)]
    hs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    proc = run_cli(*TINY, "--data-dir", str(random_data_dir), "--out-dir", str(out),
                   "--init-from", str(tmp_path / "hf"), "--max-steps", "2", *QUIET,
                   "--max-lr", "1e-9", "--warmup-steps", "0",
                   "--hellaswag-every", "1", "--hellaswag-file", str(hs))
    assert proc.returncode == 0, proc.stderr
    assert "initialised from" in proc.stdout
    ckpt = load(out / "ckpt_000002.pt")
    assert from_dict(ckpt["config"]).model.n_layer == 3  # the shape came from the folder
    # lr ~0: the weights are still the exported ones (the real vocab rows)
    torch.testing.assert_close(ckpt["model"]["transformer.h.2.mlp.c_fc.weight"],
                               source.transformer.h[2].mlp.c_fc.weight, atol=1e-6, rtol=0)
    records = read_metrics(out, "hellaswag")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["total"] == 6 and 0 <= r["acc_norm"] <= 1 for r in records)
    assert all(r["set"] == str(hs) for r in records)  # a file of one's own, named as such
    assert f"(acc {records[-1]['acc']:.4f}, 6 examples of {hs})" in proc.stdout


def test_init_from_missing_folder_is_a_clear_error(random_data_dir: Path, tmp_path: Path) -> None:
    proc = run_cli(*TINY, "--data-dir", str(random_data_dir), "--out-dir", str(tmp_path / "r"),
                   "--init-from", str(tmp_path / "nope"))
    assert proc.returncode == 1
    assert "--init-from" in proc.stderr and "nope" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------
# runs that say what they do


@pytest.mark.slow
def test_resume_past_the_last_step_does_nothing_and_says_so(random_data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(random_data_dir), "--out-dir", str(out)]
    assert run_cli(*args).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"}
    proc = run_cli(*args, "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do: the run is already at step 2 and --max-steps is 2" in proc.stdout
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"} == before


def test_saved_recipe_repeats_the_run_instead_of_resuming_it(random_data_dir: Path, tmp_path: Path) -> None:
    first = tmp_path / "first"
    proc = run_cli(*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(random_data_dir),
                   "--out-dir", str(first), "--resume", "auto", "--stop-at-step", "1")
    assert proc.returncode == 0, proc.stderr
    recipe = (first / "config.toml").read_text()
    assert recipe.startswith("# the resolved config of this run")
    cfg = parse_args(["--config", str(first / "config.toml")])
    assert cfg.checkpoint.resume == "none" and cfg.checkpoint.stop_at_step is None
    assert cfg.train.max_steps == 2 and cfg.data.data_dir == str(random_data_dir)


def test_warmup_longer_than_the_run_is_warned_about(random_data_dir: Path, tmp_path: Path) -> None:
    proc = run_cli(*TINY, *QUIET, "--max-steps", "1", "--warmup-steps", "50",
                   "--data-dir", str(random_data_dir), "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert "warning: --warmup-steps 50 is longer than the run (--max-steps 1)" in proc.stderr


def test_samples_print_as_text(shakespeare_dir: Path, tmp_path: Path) -> None:
    proc = run_cli(*TINY, "--val-every", "0", "--max-steps", "1", "--sample-every", "1",
                   "--sample-tokens", "24", "--sample-prompt", "ROMEO:\nO", "--data-dir",
                   str(shakespeare_dir), "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    samples = proc.stdout[proc.stdout.index("--- sample 0"):]
    assert samples.startswith("--- sample 0 at step 1:\nROMEO:\nO")  # real newlines
    assert "\\n" not in samples


@pytest.mark.parametrize("kind", ["llm.c", "build-nanogpt"])
def test_trains_on_other_trainers_shards(kind: str, tmp_path: Path) -> None:
    tokens = np.random.default_rng(1).integers(0, 50257, 20_000).astype(np.uint16)
    data = tmp_path / "data"
    data.mkdir()
    if kind == "llm.c":
        header = np.zeros(256, dtype="<i4")
        header[:3] = 20240520, 1, tokens.size
        (data / "fineweb_train_000001.bin").write_bytes(header.tobytes() + tokens.tobytes())
    else:
        np.save(data / "edufineweb_train_000000.npy", tokens)
    proc = run_cli(*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data),
                   "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert "train tokens 20,000" in proc.stdout
