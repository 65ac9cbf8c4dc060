"""--fp8 (gpt/model/fp8.py): FP8 matmuls through torchao's float8 training, emulated on the CPU.
The flag and its rules, which layers convert, a tiny model training within a stated
tolerance of the same run without FP8, the weights it starts from and saves (the keys
and values of an unconverted model), exact resume, evaluation in high precision,
DDP and FSDP, the planner, the dry run, and torchao missing."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from helpers import (QUIET, REPO, SHAKESPEARE, TINY, assert_resume_is_exact,
                     assert_two_ranks_match_one, read_metrics, run_cli)
from gpt.checkpoint.files import load
from gpt.core.cli import parse_args
from gpt.core.config import ConfigError
from gpt.core.config_check import resolve
from gpt.core.errors import UserError
from gpt.engine import parallel
from gpt.model import fp8
from gpt.model.transformer import GPT
from gpt.plan import memory
from gpt.runtime.world import Runtime

needs_torchao = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None,
    reason='torchao is not installed (pip install -e ".[fp8]")')
CPU = Runtime(device=torch.device("cpu"))


@pytest.fixture(scope="module")
def text_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Shakespeare as shards: real text, so a few steps lower the loss."""
    import numpy as np

    from gpt.data.shards import write_shard
    from gpt.data.tokenizer import gpt2_tokenizer

    folder = tmp_path_factory.mktemp("shakespeare")
    tokens = np.array(gpt2_tokenizer().encode_ordinary(SHAKESPEARE.read_text()))
    write_shard(folder / "train_000000.bin", tokens[:200_000])
    write_shard(folder / "val_000000.bin", tokens[200_000:230_000])
    return folder


# ---- the flag and its rules (no torchao needed)


def test_the_flag_takes_the_two_recipes_and_is_off_by_default(tmp_path: Path) -> None:
    assert parse_args([]).train.fp8 == "none" and parse_args([]).train.fp8_head is False
    for recipe in ("tensorwise", "rowwise"):
        assert parse_args(["--fp8", recipe]).train.fp8 == recipe
    path = tmp_path / "c.toml"
    path.write_text('[train]\nfp8 = "rowwise"\nfp8_head = true\nchunked_loss = false\n')
    cfg = parse_args(["--config", str(path)])
    assert (cfg.train.fp8, cfg.train.fp8_head) == ("rowwise", True)


@pytest.mark.parametrize("values, words", [
    ({"fp8": "tensorwise", "n_embd": 72, "n_head": 2}, "--n-embd 72 is not"),
    ({"fp8": "tensorwise", "dtype": "fp16"}, "use --dtype bf16"),
    ({"fp8_head": True}, "--fp8 is none"),
    ({"fp8": "rowwise", "fp8_head": True, "chunked_loss": True}, "drop --chunked-loss"),
    ({"fp8": "rowwise", "fp8_head": True, "loss_kernel": "ours"}, "drop --chunked-loss"),
    ({"fp8": "rowwise", "fp8_head": True, "chunked_loss": False, "vocab_size": 50257},
     "--vocab-size 50257 is not a multiple of 16"),
])
def test_what_fp8_cannot_do_is_refused_in_one_line(values, words) -> None:
    with pytest.raises(ConfigError) as exc:
        resolve({"preset": "tiny", **values})
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_a_bad_recipe_name_is_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--fp8", "e4m3"])
    assert exc.value.code == 2 and "invalid choice: 'e4m3'" in capsys.readouterr().err


def test_missing_torchao_is_one_line_with_the_install_hint(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)  # importing it now fails
    with pytest.raises(UserError, match=r"needs torchao, which is not installed: pip install -e "
                                        r"\"\.\[fp8\]\""):
        fp8.check(parse_args(["--fp8", "tensorwise"]).train, torch.device("cpu"))
    fp8.check(parse_args([]).train, torch.device("cpu"))  # --fp8 none needs nothing


@pytest.mark.slow
def test_the_trainer_without_torchao_stops_before_anything_is_written(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['torchao'] = None; "  # import torchao now fails
            "from gpt.entry import train_main; raise SystemExit(train_main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, *TINY, *QUIET, "--fp8", "tensorwise",
                           "--out-dir", str(tmp_path / "run")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "needs torchao" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_torchao_too_new_for_the_minimum_torch_names_the_release_that_imports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip resolves .[fp8] to the newest torchao, and 0.18 does not import under torch 2.9:
    the line says which release does, not "reinstall it" (which would fetch 0.18 again)."""
    (tmp_path / "torchao").mkdir()
    (tmp_path / "torchao" / "__init__.py").write_text(
        "raise ImportError(\"cannot import name 'ScalingType' from 'torch.nn.functional'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "torchao"]:
        monkeypatch.delitem(sys.modules, name)
    releases = {"torchao": "0.18.0"}
    monkeypatch.setattr(fp8.importlib.metadata, "version", releases.__getitem__)
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    with pytest.raises(UserError, match=r"^--fp8 tensorwise needs torchao, and torchao 0\.18\.0 "
                       r"does not import under torch 2\.9\.1\+cu128 .*pip install torchao==0\.17\.0$"):
        fp8._torchao("--fp8 tensorwise")
    monkeypatch.setattr(torch, "__version__", "2.11.0")  # a torch it is built for: the import's reason
    with pytest.raises(UserError, match=r"installed but fails to import \(ImportError: cannot "
                                        r"import name 'ScalingType'.*reinstall it"):
        fp8._torchao("--fp8 tensorwise")


def test_fp8_head_where_the_chunked_loss_runs_the_head_is_refused() -> None:
    train = parse_args(["--fp8", "tensorwise", "--fp8-head"]).train  # chunked loss unset
    with pytest.raises(UserError, match="on cpu the chunked loss"):
        fp8.check(train, torch.device("cpu"))


def test_mps_is_refused() -> None:
    with pytest.raises(UserError, match="MPS has no FP8"):
        fp8.check(parse_args(["--fp8", "rowwise"]).train, torch.device("mps"))


def test_the_planner_plans_the_step_without_fp8_and_says_so() -> None:
    base = ["--model", "tiny", "--block-size", "64", "--seq-len", "64", "--batch-size", "2",
            "--total-batch-tokens", "256", "--vocab-size", "512"]
    plain = memory.plan(parse_args(base), device_type="cpu")
    planned = memory.plan(parse_args([*base, "--fp8", "tensorwise"]), device_type="cpu")
    assert planned.peak_bytes == plain.peak_bytes
    assert memory.FP8_PLANNED in planned.assumptions and planned.setup["fp8"] == "tensorwise"
    assert "fp8 tensorwise planned as its bf16 step" in planned.table()


# ---- converting (torchao)


def tiny(**overrides):
    return parse_args(["--model", "tiny", "--block-size", "64", "--seq-len", "64",
                       "--vocab-size", "512", *[a for k, v in overrides.items()
                                                for a in (f"--{k.replace('_', '-')}", str(v))]])


@needs_torchao
def test_the_blocks_linear_layers_convert_and_the_head_only_when_asked() -> None:
    cfg = tiny(n_layer=3)
    model = GPT(cfg.model)
    kept = fp8.convert(model, "tensorwise", head=False, device_type="cpu")
    names = fp8.converted(model)
    assert kept == ["lm_head"]
    assert len(names) == 3 * 4 and all(n.startswith("transformer.h.") for n in names)
    assert {n.split(".", 3)[3] for n in names} == {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                   "mlp.c_proj"}
    headed = GPT(cfg.model)
    assert fp8.convert(headed, "rowwise", head=True, device_type="cpu") == []
    assert fp8.is_fp8(headed.lm_head)
    assert headed.lm_head.weight is headed.transformer.wte.weight  # still tied
    assert "EMULATED on cpu" in fp8.describe("rowwise", True, [], 13, "cpu")


@needs_torchao
def test_a_layer_whose_dimensions_are_not_multiples_of_16_stays_in_high_precision() -> None:
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 40), nn.Linear(40, 32))
    kept = fp8.convert(model, "tensorwise", head=False, device_type="cpu")
    assert kept == ["1", "2"] and fp8.converted(model) == ["0"]


@needs_torchao
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_an_fp8_model_starts_from_the_same_weights_with_the_same_keys(recipe: str) -> None:
    """Built on the meta device, converted, then initialised (the trainer's order): the
    very weights and state dict keys of the model without FP8, so every checkpoint reader
    takes it, and a seed means one start whatever --fp8 says."""
    states = []
    for which in ("none", recipe):
        cfg = tiny(n_layer=2, fp8=which)
        with torch.device("meta"):
            model = GPT(cfg.model)
        torch.manual_seed(0)
        parallel.parallelize(model, cfg.train, cfg.optim, CPU)
        states.append(parallel.model_state(model))
    assert list(states[0]) == list(states[1])
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@needs_torchao
def test_high_precision_runs_the_same_weights_as_plain_linear_layers() -> None:
    torch.manual_seed(0)
    ref = GPT(tiny().model)
    model = GPT(tiny().model)
    model.load_state_dict(ref.state_dict())
    fp8.convert(model, "tensorwise", head=False, device_type="cpu")
    x = torch.randint(0, 512, (2, 64))
    with torch.no_grad():
        want = ref(x)[0]
        rounded = model(x)[0]
        with fp8.high_precision(model):
            exact = model(x)[0]
            assert fp8.converted(model) == []
        assert len(fp8.converted(model)) == 8
        with pytest.raises(RuntimeError), fp8.high_precision(model):
            raise RuntimeError("an evaluation fails")
        assert len(fp8.converted(model)) == 8  # restored all the same
    assert torch.equal(exact, want) and not torch.equal(rounded, want)


@needs_torchao
def test_a_compiled_fp8_model_compiles_each_graph_once_across_evaluations() -> None:
    """The trainer evaluates inside high_precision(), which switches the layers' class:
    torch.compile guards on it and compiles the evaluation's graph once, then keeps both
    graphs, so training and validation alternating never recompile (the compiler's cache
    would otherwise fill and fall back to eager mode), and the evaluation's graph runs
    the plain matmuls."""
    torch._dynamo.reset()
    graphs: list[int] = []

    def counting(gm: torch.fx.GraphModule, inputs: list) -> object:
        graphs.append(1)
        return gm.forward

    torch.manual_seed(0)
    ref = GPT(tiny().model)
    model = GPT(tiny().model)
    model.load_state_dict(ref.state_dict())
    fp8.convert(model, "tensorwise", head=False, device_type="cpu")
    compiled = torch.compile(model, backend=counting)
    x = torch.randint(0, 512, (2, 64))
    with torch.no_grad():
        want = ref(x, x)[1]
    for _ in range(3):
        compiled(x, x)[1].backward()
        with torch.no_grad(), fp8.high_precision(model):
            assert torch.equal(compiled(x, x)[1], want)
    assert len(graphs) == 2
    torch._dynamo.reset()


@functools.cache  # the run without FP8 is each recipe's reference
def train_losses(recipe: str, steps: int, data: Path) -> list[float]:
    """A tiny model's loss over `steps` steps on real text, in-process, with FP8 or not
    (the same batches and initial weights either way)."""
    from gpt.data.loader import ShardLoader
    from gpt.engine.step import forward_backward, optimizer_step

    cfg = tiny(n_layer=2, n_embd=128, n_head=4, fp8=recipe, vocab_size=50304,
               batch_size=8)
    with torch.device("meta"):
        model = GPT(cfg.model)
    torch.manual_seed(0)
    par = parallel.parallelize(model, cfg.train, cfg.optim, CPU)
    loader = ShardLoader(str(data), "train", batch_size=8, seq_len=64, rank=0, world_size=1,
                         seed=0, device=torch.device("cpu"))
    out = []
    for _ in range(steps):
        loss, norm = forward_backward(par.train_model, par.scaler, par.optimizer, loader, 1,
                                      1.0, "cpu", torch.float32)
        optimizer_step(par.optimizer, par.scaler, 3e-3, norm)
        out.append(loss.item())
    return out


@pytest.mark.slow
@pytest.mark.numerics
@needs_torchao
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_a_tiny_model_trains_in_fp8_within_tolerance_of_fp32(recipe: str,
                                                             text_data: Path) -> None:
    """Tolerance: e4m3 keeps 3 mantissa bits, so each cast rounds an element by up to
    2**-4 (6%; about 4% rms), and an FP8 layer's output comes out a few percent off. The
    loss is a mean over the step's 512 tokens of a smooth function of those outputs, in
    which such independent errors mostly cancel: measured, the two runs' losses differed by
    at most 0.3% at any of these 16 steps (10.8 -> 6.5, the part of the curve where the
    model learns fast; later steps at this learning rate wander, a spike in either run
    moving it by 10%). The bound is 1%, and FP8 must still have changed the numbers."""
    plain = train_losses("none", 16, text_data)
    rounded = train_losses(recipe, 16, text_data)
    assert plain[-1] < plain[0] - 3  # the model learned: the comparison means something
    assert rounded == pytest.approx(plain, rel=0.01)
    assert rounded != plain


# ---- the trainer, end to end on the CPU (emulated)


def run_args(data: Path, recipe: str = "tensorwise") -> list[str]:
    return [*TINY, *QUIET, "--data-dir", str(data), "--fp8", recipe, "--val-every", "2",
            "--val-steps", "2", "--total-batch-tokens", "512"]


@pytest.mark.numerics
@needs_torchao
@pytest.mark.slow
def test_a_run_with_fp8_resumes_bit_exactly(text_data: Path, tmp_path: Path) -> None:
    split = assert_resume_is_exact(run_args(text_data), tmp_path)
    first = read_metrics(split, "run")[0]
    assert first["fp8"].startswith("tensorwise on 8 linear layers") and "EMULATED" in first["fp8"]
    straight = load(tmp_path / "straight" / "ckpt_000004.pt")["model"]
    resumed = load(split / "ckpt_000004.pt")["model"]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


@pytest.mark.slow
@pytest.mark.numerics
@needs_torchao
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_a_checkpoint_of_an_fp8_run_is_any_readers(text_data: Path, tmp_path: Path,
                                                   recipe: str) -> None:
    """Its keys are those of a run without FP8, a plain GPT loads it, and the validation
    the run reported (in high precision) is the loss a plain model of those weights has."""
    from gpt.checkpoint.model_load import load_checkpoint_model
    from gpt.data.loader import ShardLoader
    from gpt.eval.validation import val_loss

    out, plain = tmp_path / "fp8", tmp_path / "plain"
    proc = run_cli(*run_args(text_data, recipe), "--max-steps", "2", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"fp8 {recipe} on 8 linear layers (lm_head in high precision), EMULATED on cpu" \
        in proc.stdout
    proc = run_cli(*run_args(text_data, "none"), "--max-steps", "2", "--out-dir", str(plain))
    assert proc.returncode == 0, proc.stderr
    ckpt = load(out / "ckpt_000002.pt")
    assert list(ckpt["model"]) == list(load(plain / "ckpt_000002.pt")["model"])
    assert ckpt["config"]["train"]["fp8"] == recipe
    model = load_checkpoint_model(out / "ckpt_000002.pt")
    assert type(model) is GPT and not fp8.converted(model)
    loader = ShardLoader(str(text_data), "val", batch_size=4, seq_len=32, rank=0, world_size=1,
                         seed=1337, device=torch.device("cpu"))
    from gpt.eval import bpb
    reported = [r["val_loss"] for r in read_metrics(out, "val") if r["step"] == 2]
    mean, _ = val_loss(model, loader, 2, "cpu", torch.float32,
                       bpb.token_bytes(model.config.vocab_size, torch.device("cpu"))).tolist()
    assert reported == [pytest.approx(mean, rel=1e-6)]
    # and at step 0, before any FP8 step, it is the plain run's validation exactly
    assert [r["val_loss"] for r in read_metrics(out, "val")][0] == \
        [r["val_loss"] for r in read_metrics(plain, "val")][0]


@needs_torchao
def test_the_dry_run_says_fp8_is_emulated_here(text_data: Path, tmp_path: Path) -> None:
    proc = run_cli(*run_args(text_data), "--dry-run", "--out-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert "| fp8 tensorwise (emulated)" in proc.stdout
    assert "fp8 tensorwise planned as its bf16 step" in proc.stdout


@pytest.mark.numerics
@needs_torchao
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_fp8_on_two_ranks_trains_as_one_process(mode: str, text_data: Path,
                                                tmp_path: Path) -> None:
    """Each FP8 cast's scale comes from the tensor it casts: a micro-batch's input on its
    rank, the whole (gathered) weight under FSDP; so two ranks compute what one process
    does over the same micro-batches: the same losses and gradient norms (helpers' LOSS_REL
    and GRAD_NORM_REL). Not helpers' weight bound, which is fp32 rounding amplified by AdamW:
    a cast to e4m3 (3 mantissa bits) tips the other way where another summation order moves
    its input across a rounding boundary, a gradient noise far above fp32's (measured under
    ATEN_CPU_CAPABILITY=default: 0.26% of the weights beyond lr / 100, where the bound allows
    0.1% and a planted bug moves 10-95%)."""
    assert_two_ranks_match_one([*run_args(text_data), "--max-steps", "3", "--val-every", "0"],
                               mode, tmp_path, weights=False)


@pytest.mark.numerics
@needs_torchao
@pytest.mark.slow
def test_fp8_compiles(text_data: Path, tmp_path: Path, monkeypatch) -> None:
    """torchao's float8 is meant to be compiled: the compiled step (aot_eager: the same
    graphs, without inductor's code generation) gives the eager step's losses, and the
    evaluation in high precision between training steps runs its own graph."""
    from gpt.entry import train_main as main

    monkeypatch.setattr(parallel, "COMPILE_BACKEND", "aot_eager")
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        assert main([*run_args(text_data), "--max-steps", "3", *extra,
                     "--out-dir", str(tmp_path / name)]) == 0
    eager, compiled = (read_metrics(tmp_path / n, "train") for n in ("eager", "compiled"))
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], rel=1e-5)
    assert [r["val_loss"] for r in read_metrics(tmp_path / "compiled", "val")] == \
        pytest.approx([r["val_loss"] for r in read_metrics(tmp_path / "eager", "val")], rel=1e-5)
