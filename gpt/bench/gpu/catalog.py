"""The GPU acceptance's stages by name (`python -m gpt.bench gpu STAGE ...`): what each runs,
the question it answers, what it needs from the user and which optional packages some of
its cells use. Their cells are gpt/bench/gpu/stages.py's; the order here is `all`'s and
--plan's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    title: str
    question: str
    needs: tuple[str, ...] = ()  # "nanogpt", "corpus": inputs without which it cannot run
    # packages some of its cells use (installed from --wheels where not importable; the
    # cells that need one are skipped without it: a cell's own needs and uses, stages.py)
    optional: tuple[str, ...] = ()
    measured: bool = True  # whether a GPU run has checked its estimates


STAGES: dict[str, Stage] = {
    "cuda-tests": Stage("the CUDA tests (pytest -m cuda)", "does the CUDA path work",
                        optional=("liger_kernel", "cut_cross_entropy")),
    "throughput": Stage("GPT-2 124M, ours vs build-nanogpt at micro-batch 64, 32 and 16",
                        "step time, tokens/s, MFU, compile time and memory against the baseline, "
                        "and whether the losses agree step by step", needs=("nanogpt",)),
    "xl": Stage("GPT-2 XL on one GPU: FSDP2 with activation checkpointing (torchrun), and "
                "the layout the trainer chooses itself (--parallel/--activation-checkpointing/"
                "--batch-size auto)",
                "does XL train, at what MFU, in how much memory, and what the trainer's own "
                "choice of layout buys"),
    "loss-kernels": Stage("the whole logits' loss on its own (inductor's compiled loss, our fused "
                          "Triton cross-entropy's backward mode and its forward mode at each "
                          "launch, without and with the soft cap, judged against the compiled "
                          "loss); then GPT-2 124M at micro-batch 64: the whole logits, the "
                          "chunked loss through Liger Kernel's and Cut Cross-Entropy's kernels, "
                          "and the whole logits through our fused cross-entropy in each of its "
                          "modes",
                          "what each head + loss kernel costs on CUDA against the whole logits, "
                          "and the memory it saves",
                          optional=("liger_kernel", "cut_cross_entropy")),
    "fused-compile": Stage("GPT-2 124M at micro-batch 64 with the speedrun recipe's soft cap: "
                           "the whole logits and --loss-kernel fused under the default compile "
                           "mode, --loss-kernel fused under reduce-overhead and max-autotune",
                           "does the fused loss (three special functions an element with the "
                           "cap) keep its speed, and run at all, under every compile mode",
                           measured=False),
    "profile": Stage("GPT-2 124M at micro-batch 64 and GPT-2 XL, each with a torch.profiler "
                     "trace of its last two steps",
                     "where a step's GPU time goes: each kind of kernel's share, the top "
                     "kernels, the gaps between them"),
    "fp8": Stage("GPT-2 124M at micro-batch 64: bf16 vs --fp8 tensorwise and --fp8 rowwise; "
                 "GPT-2 XL in the layout the trainer chooses: bf16 vs --fp8 tensorwise",
                 "what FP8 matmuls (torchao's float8 training) buy in tokens/s and memory, "
                 "where they are expected to lose (124M) and to win (1.5B)",
                 optional=("torchao",), measured=False),
    "fp8-loss": Stage("GPT-2 124M on the user's corpus, 200 steps: bf16 vs --fp8 tensorwise",
                      "does FP8 train as bf16 does: the loss difference over the steps",
                      needs=("corpus",), optional=("torchao",), measured=False),
    "speedrun": Stage("GPT-2 124M at micro-batch 64: the GPT-2 recipe vs the speedrun recipe "
                      "(configs/gpt2-124m-speedrun.toml)",
                      "what the speedrun recipe's parts (Muon, rotary, ReLU^2, the untied "
                      "head, the soft cap ...) cost in tokens/s", measured=False),
    "max-autotune": Stage("GPT-2 124M at micro-batch 64 under --compile-mode max-autotune",
                          "what max-autotune's minutes of compiling buy", measured=False),
    "ladder": Stage("the speed ladder (python -m gpt.bench ladder)",
                    "where the speed comes from, one optimisation at a time", measured=False),
    "tokens": Stage("GPT-2 recipe vs the speedrun recipe at 124M on the user's corpus "
                    "(python -m gpt.bench tokens)",
                    "how many fewer tokens the new recipe needs at GPU scale",
                    needs=("corpus",), measured=False),
}
