"""The configuration schema: one frozen dataclass per component (its section) and the
model presets. A config as a dict (checkpoints) and as text (a run's banner) is
gpt/core/config_io.py's; the rules a config must meet are gpt/core/config_check.py's
validate(), run once by its resolve().

Values flow one way: dataclass defaults <- model preset <- TOML file <- CLI flags
(gpt/core/cli.py reads the last two), then config_check.validate(), then the frozen Config
is passed down, each component taking its own section. Every field is a flag (``n_layer`` -> ``--n-layer``) whose help is the field's
metadata, so field names are unique across sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection

from gpt.core.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration value a user must change; the message names the flag."""

    exit_code = 2  # argparse's status for a bad command line


# The config schema's version, written with every checkpoint (gpt/checkpoint/files.py). It tells
# a field that a saved config lacks because it did not exist yet (it takes its default:
# what the code did before) from one that was removed from a config that had it (an
# error: read with its default, a --relu2 model would load as a GELU one). Adding a field
# raises it, and the field's `since` says from which version on configs hold it.
SCHEMA_VERSION = 3

# The word an option takes to have the trainer choose its value before the run
# (gpt/plan/layout.py): --parallel auto, --activation-checkpointing auto, --batch-size auto.
AUTO = "auto"


def _opt(default: Any, help: str, choices: Collection[Any] | None = None,
         since: int = 1, words: tuple[str, ...] = (), spellings: dict[bool, str] | None = None
         ) -> Any:
    """A config field: its default, its help (the flag's), its allowed values, and the
    SCHEMA_VERSION from which every saved config holds it. `words`: strings a field of
    another type also takes (batch_size's "auto"); `spellings`: the values that the
    booleans of a field that once was a switch stand for (true/false in old config files
    and checkpoints, --flag and --no-flag on the command line)."""
    return field(default=default, metadata={"help": help, "choices": choices, "since": since,
                                            "words": words, "spellings": spellings})


@dataclass(frozen=True)
class ModelConfig:
    block_size: int = _opt(1024, "maximum context length (rows of the position embedding)")
    vocab_size: int = _opt(
        50304,
        "embedding rows; GPT-2's 50257 padded to a multiple of 128 for faster matmuls "
        "(the padded ids are never sampled)",
    )
    n_layer: int = _opt(12, "number of transformer blocks")
    n_head: int = _opt(12, "attention heads per block")
    n_embd: int = _opt(768, "model width d_model (the MLP is 4x this)")
    dropout: float = _opt(0.0, "dropout probability (0 for pre-training)")
    # Beyond GPT-2: the parts of today's fast small-model recipes (the public 124M
    # speedrun's). Each is off by default; with all off the model is GPT-2's, bit for bit.
    rotary: bool = _opt(False, "rotary position embeddings in attention, in place of the "
                        "learned position embedding")
    rmsnorm: bool = _opt(False, "RMSNorm in place of LayerNorm")
    qk_norm: bool = _opt(False, "RMS-normalise each head's queries and keys before attention")
    relu2: bool = _opt(False, "ReLU^2 in the MLP in place of GELU")
    untied_head: bool = _opt(False, "an LM head of its own instead of the token embedding")
    zero_init_proj: bool = _opt(False, "zero-initialise each block's two output projections "
                                "(and an untied head)")
    logit_softcap: float = _opt(0.0, "soft-cap the logits at +-C (C * tanh(z / C)); 0: off")
    # The speedrun's further parts (off in the new recipe unless gpt.bench tokens --ablation
    # shows they help; docs/speedrun.md)
    value_embeds: bool = _opt(False, "value embeddings: token tables of their own mixed into "
                              "the attention values of the first and last min(3, n_layer/2) blocks")
    unet_skips: bool = _opt(False, "U-net skips: each late block also gets its mirror early "
                            "block's output, times a learned weight")
    attn_window: int = _opt(0, "sliding-window attention: each query sees at most this many "
                            "positions (itself included) at the first step; 0: off")
    attn_window_final: int = _opt(0, "the window at the last step, reached linearly from "
                                  "--attn-window (0: the block size)")
    doc_mask: bool = _opt(False, "document-aware attention: no attention across the "
                          "end-of-text token (50256) that separates documents")


# ModelConfig's fields that only choose the starting weights, not the model: a resume may
# change them, and an export does not look at them
INIT_ONLY = ("zero_init_proj",)


# name -> (n_layer, n_head, n_embd). GPT-2's four sizes, the benchmark sizes
# (d_ff = 4 * d_model throughout) and small models for tests and CPU runs.
PRESETS: dict[str, tuple[int, int, int]] = {
    "gpt2": (12, 12, 768),
    "gpt2-medium": (24, 16, 1024),
    "gpt2-large": (36, 20, 1280),
    "gpt2-xl": (48, 25, 1600),
    "small": (12, 12, 768),
    "medium": (24, 16, 1024),
    "large": (36, 20, 1280),
    "xl": (48, 25, 1600),
    "2.7B": (32, 32, 2560),
    "mini": (4, 4, 256),
    "tiny": (2, 2, 64),
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """The ModelConfig of a named preset, with optional field overrides."""
    if name not in PRESETS:
        raise ConfigError(f"--model {name!r} is not a preset; choose one of: {', '.join(PRESETS)}")
    n_layer, n_head, n_embd = PRESETS[name]
    return ModelConfig(**{"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, **overrides})


@dataclass(frozen=True)
class DataConfig:
    data_dir: str = _opt("data/fineweb-edu-10B", "folder of train_*/val_* token shards "
                         "(fineweb.py's; llm.c's .bin and build-nanogpt's .npy shards too)")
    batch_size: int | str = _opt(
        64, "micro-batch size B: sequences per forward pass per process; auto: the largest "
        "that the memory planner fits on the device and that divides --total-batch-tokens "
        "(gpt/plan/layout.py)", words=(AUTO,))
    seq_len: int = _opt(1024, "sequence length T in tokens (at most --block-size)")
    total_batch_tokens: int = _opt(
        524288, "tokens per optimizer step across all processes (2**19 for GPT-2 124M)"
    )
    shuffle: bool = _opt(False, "shuffle the order of training shards each pass")
    check_tokens: bool = _opt(
        False, "scan every shard at start-up for token ids outside the vocabulary (slow on big data)"
    )
    allow_incomplete_data: bool = _opt(
        False, "train on a data folder that fineweb.py is still writing (a warning, not an error)"
    )


# --optimizer's choices (name -> the module of its row): each a row of
# gpt/optim/optimizer.py's OPTIMIZERS, the same names, which a test holds equal. A dict
# the flag's choices refer to, so that a row added there (a test's) is a choice here too.
OPTIMIZER_NAMES: dict[str, str] = {"adamw": "gpt/optim/adamw.py", "muon": "gpt/optim/muon.py"}


@dataclass(frozen=True)
class OptimConfig:
    max_lr: float = _opt(6e-4, "peak learning rate, reached at the end of warm-up")
    min_lr_ratio: float = _opt(0.1, "final learning rate as a fraction of --max-lr")
    warmup_steps: int = _opt(715, "linear warm-up steps")
    weight_decay: float = _opt(0.1, "AdamW weight decay, on tensors of 2 or more dimensions only")
    beta1: float = _opt(0.9, "AdamW beta1")
    beta2: float = _opt(0.95, "AdamW beta2")
    eps: float = _opt(1e-8, "AdamW epsilon")
    grad_clip: float = _opt(1.0, "clip the global gradient norm to this (0 disables)")
    fused: bool | None = _opt(None, "fused AdamW kernel (default: where the device supports it)")
    lr_schedule: str = _opt(
        "cosine", "after warm-up: cosine (GPT-2) down to the min, or trapezoid: hold --max-lr, "
        "then a straight line down to the min over the last --cooldown-frac of the steps",
        ("cosine", "trapezoid"))
    cooldown_frac: float = _opt(0.4, "the trapezoid schedule's final decay, as a fraction of "
                                "--max-steps")
    optimizer: str = _opt(
        "adamw", "adamw, or muon: Muon for the blocks' weight matrices and AdamW (at "
        "--max-lr) for embeddings, head, biases and gains", OPTIMIZER_NAMES)
    muon_lr: float = _opt(0.02, "Muon's peak learning rate (the schedule scales it as --max-lr's)")
    muon_momentum: float = _opt(0.95, "Muon's momentum (Nesterov)")
    muon_momentum_warmup: int = _opt(0, "steps over which Muon's momentum rises from 0.85 to "
                                     "--muon-momentum (0: none)")
    muon_weight_decay: float = _opt(0.0, "Muon's decoupled weight decay (x its learning rate)")


@dataclass(frozen=True)
class TrainConfig:
    """How the steps run: length, device, precision, parallelism."""

    max_steps: int = _opt(19073, "optimizer steps (19073 x 2**19 tokens = 10B tokens)")
    device: str = _opt("auto", "device; auto picks cuda > mps > cpu", ("auto", "cuda", "mps", "cpu"))
    dtype: str = _opt(
        "auto",
        "compute precision: bf16/fp16 autocast or plain fp32; auto is bf16 on CUDA "
        "(fp16 where bf16 is missing) and MPS, fp32 on CPU",
        ("auto", "fp32", "bf16", "fp16"),
    )
    tf32: bool = _opt(True, "allow TF32 tensor-core matmuls for fp32 work on CUDA")
    compile: bool | None = _opt(None, "torch.compile the model (default: on for CUDA only)")
    compile_mode: str = _opt(
        "default", "torch.compile mode (default: default, inductor's usual kernels): "
        "max-autotune searches kernel configs (minutes of compiling), reduce-overhead adds "
        "CUDA graphs",
        ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    )
    seed: int = _opt(1337, "random seed for initialisation and data order")
    out_dir: str = _opt("runs/gpt2", "folder for the log, metrics, config and checkpoints")
    log_every: int = _opt(1, "print a log line every N steps (loss is read back only then)")
    tensorboard: bool = _opt(
        False, "also write every metrics record as TensorBoard events to OUT_DIR/tensorboard "
        "(pip install -e '.[tensorboard]')"
    )
    wandb_project: str | None = _opt(
        None, "also log every metrics record to Weights & Biases in this project "
        "(pip install -e '.[wandb]'; WANDB_MODE=offline keeps the run on disk)"
    )
    max_bad_steps: int = _opt(
        5, "stop after this many steps in a row with a non-finite loss or gradient (they are skipped)"
    )
    parallel: str = _opt(
        "ddp", "data parallelism under torchrun: ddp, zero1 (sharded optimizer) or fsdp "
        "(sharded everything, FSDP2); auto: the least sharding whose step the memory planner "
        "fits on the device (never fsdp in one process; gpt/plan/layout.py)",
        ("ddp", "zero1", "fsdp", AUTO),
    )
    activation_checkpointing: str = _opt(
        "none", "recompute activations in the backward pass to save memory (any --parallel "
        "mode): blocks (the flag alone): keep only each block's input; selective: keep the "
        "matmuls' and attention's outputs, recompute the norms, activation functions and "
        "casts; auto: the cheapest (none, selective, blocks) whose step fits the device",
        ("none", "selective", "blocks", AUTO), spellings={True: "blocks", False: "none"},
    )
    fsdp_param_dtype: str = _opt(
        "fp32", "--parallel fsdp: the dtype parameters are all-gathered and computed in. fp32: "
        "as the other modes (autocast does the bf16 matmuls); bf16: half the all-gather "
        "traffic and unsharded-parameter memory, torchtitan's default, with LayerNorm gains "
        "and the residual stream between blocks in bf16 too, so the loss curve differs "
        "slightly. Either way gradients are reduced, and the weights and AdamW state kept, "
        "in fp32", ("fp32", "bf16"),
    )
    finite_check_every: int = _opt(
        100, "check that the weights and optimizer state are finite every N steps (and before "
        "every checkpoint, always); a step whose gradient is not finite is skipped on the "
        "device either way"
    )
    dist_timeout: float = _opt(
        600.0, "seconds a collective may wait for the other ranks before the job fails"
    )
    cpu_malloc_reuse: bool = _opt(
        True, "on CPU (Linux, glibc): keep freed memory for reuse instead of handing big blocks "
        "back to the OS every step; about 2x faster small-model steps for more resident memory "
        "(benchmarks/cpu_malloc.md)"
    )
    chunked_loss: bool | None = _opt(
        None, "the head and cross-entropy fused and computed a chunk of rows at a time, so "
        "the whole logits and their gradient are never held (gpt/model/chunked_ce.py); "
        "--no-chunked-loss: the plain head and F.cross_entropy. Default: on for CPU and MPS; "
        "off on CUDA, where the whole logits measured fastest (on an H100 at GPT-2 124M, "
        "micro-batch 64: 5.7 GiB more than Liger Kernel's chunked loss, at 0.96x its step "
        "time; benchmarks/gpu/README.md); naming a --loss-kernel turns it on"
    )
    loss_kernel: str = _opt(
        "auto", "whose fused head + loss the chunked loss runs: ours (gpt/model/chunked_ce.py; CPU "
        "and MPS), liger (Liger Kernel) or cce (Cut Cross-Entropy), both CUDA-only and "
        "installed apart (gpt/model/loss_kernels.py); auto: liger on CUDA, ours elsewhere. Ours is "
        "not offered on CUDA: 1.45x the step time of the whole logits there, Liger's 1.05x "
        "at the same memory. fused: not a chunked loss but the whole logits' cross-entropy in "
        "our Triton kernels, which write the logits' gradient in place (gpt/model/fused_ce.py; "
        "CUDA only, being measured: python -m gpt.bench gpu loss-kernels)",
        choices=("auto", "ours", "liger", "cce", "fused"), since=2
    )
    fp8: str = _opt(
        "none", "FP8 matmuls for the blocks' linear layers through torchao's float8 training "
        "(pip install -e '.[fp8]'; gpt/model/fp8.py): tensorwise or rowwise scaling. CUDA "
        "GPUs with FP8 tensor cores (compute capability 8.9+: H100, L4, RTX 40xx); on a CPU "
        "the fp8 rounding is emulated, to check the numerics, not the speed",
        ("none", "tensorwise", "rowwise"), since=3,
    )
    fp8_head: bool = _opt(
        False, "--fp8 also for the LM head's matmul (usually left in bf16: it is the most "
        "sensitive to rounding); only where the head is a matmul of its own, without the "
        "chunked loss (off by default in compiled CUDA runs; --no-chunked-loss elsewhere)",
        since=3,
    )
    init_from: str | None = _opt(
        None, "start from OpenAI's GPT-2 weights (gpt2, gpt2-medium, gpt2-large, gpt2-xl; "
        "downloaded) or a local Hugging Face GPT-2 folder; the model shape comes from them"
    )

    def compile_on(self, device_type: str) -> bool:
        """--compile as given, or (unset) on for CUDA only."""
        return self.compile if self.compile is not None else device_type == "cuda"

    def chunked_loss_on(self, device_type: str) -> bool:
        """--chunked-loss as given; unset, on where a --loss-kernel is named, and otherwise
        everywhere but CUDA (see the option's help). --loss-kernel fused is the whole
        logits' (config_check refuses it beside --chunked-loss)."""
        if self.chunked_loss is not None:
            return self.chunked_loss
        if self.loss_kernel == "fused":
            return False
        if self.loss_kernel != "auto":
            return True
        return device_type != "cuda"


@dataclass(frozen=True)
class EvalConfig:
    """What the run measures and shows along the way: validation, HellaSwag, samples."""

    val_every: int = _opt(250, "validation loss every N steps (0 disables)")
    val_steps: int = _opt(
        20, "micro-batches each process scores per validation (a fixed slice of val_*)"
    )
    sample_every: int = _opt(1000, "print generated samples every N steps (0 disables)")
    sample_prompt: str = _opt("Hello, I'm a language model,", "prompt for the samples")
    sample_tokens: int = _opt(32, "new tokens per sample")
    num_samples: int = _opt(2, "samples generated each time")
    hellaswag_every: int = _opt(0, "HellaSwag accuracy every N steps and at the end (0 disables)")
    hellaswag_file: str | None = _opt(
        None, "HellaSwag jsonl (default: the official validation set, downloaded once)"
    )
    hellaswag_max_examples: int | None = _opt(
        None, "score only the first N HellaSwag examples (default: all 10,042)"
    )
    eval_tasks: str | None = _opt(
        None, "lm-evaluation-harness tasks to score during training, comma-separated (e.g. "
        "hellaswag,arc_easy; needs the eval extra)")
    eval_tasks_every: int = _opt(0, "score --eval-tasks every N steps and at the end (0 disables)")
    eval_tasks_limit: int | None = _opt(None, "score only the first N examples of each task")
    eval_tasks_include: str | None = _opt(None, "a folder of task YAMLs of your own for --eval-tasks")


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written and kept, and where a run starts from."""

    checkpoint_every: int = _opt(1000, "also checkpoint every N steps (0: only at the end)")
    save_checkpoints: bool = _opt(
        True, "write checkpoints (--no-save-checkpoints: none at all, not even at the end or on "
        "a stop signal; for benchmarks)"
    )
    keep_checkpoints: int = _opt(
        3, "keep the newest N periodic checkpoints (the best by val loss is kept as well)"
    )
    resume: str = _opt(
        "none",
        "'auto': continue from the newest complete checkpoint in --out-dir (start fresh if "
        "there is none); a file path: continue from that checkpoint; 'none': start fresh "
        "(refused if --out-dir already holds checkpoints)",
    )
    stop_at_step: int | None = _opt(
        None, "save a checkpoint and stop after this many steps (e.g. to fit a job time limit)"
    )


@dataclass(frozen=True)
class ProfileConfig:
    """Where the time and memory go: profiler windows, traces, snapshots, MFU's peak."""

    nvtx: bool = _opt(False, "NVTX ranges (step, forward, backward, optimizer) for Nsight Systems")
    profile_start: int = _opt(10, "first step recorded by --profile-steps / --torch-profile")
    profile_steps: int = _opt(
        0, "record this many steps from --profile-start between cudaProfilerStart/Stop, "
        "for `nsys --capture-range=cudaProfilerApi` (launch/profile_nsys.sh); 0: off"
    )
    torch_profile: str | None = _opt(
        None, "write a torch.profiler Chrome trace of steps from --profile-start to this folder"
    )
    memory_snapshot: str | None = _opt(
        None, "CUDA: record allocations and write a snapshot here at the end, for pytorch.org/memory_viz"
    )
    peak_tflops: float | None = _opt(
        None, "the device's bf16 dense peak in TFLOP/s for MFU (default: looked up by name)"
    )


@dataclass(frozen=True)
class Config:
    preset: str = "gpt2"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "profile": ProfileConfig,
}
