"""Benchmark suite: ``python -m gpt.bench SUBCOMMAND`` (see benchmarks/README.md).

Subcommands:
    model       sizes x context x batch x {fwd, fwdbwd, step} x {fp32, tf32, bf16} x compile
    components  embeddings, transformer blocks and head+loss timed separately
    attention   naive vs SDPA backends (flash, efficient, cuDNN, math) vs compiled naive
    ladder      the GPT-2 speed ladder, each optimisation on top of the last
    compile     eager vs torch.compile (attention and whole model), compile time apart
    comm        all-reduce bandwidth, DDP compute vs communication (under torchrun)
    prepare     fineweb.py's shard preparation vs a multiprocessing.Pool baseline
    gpu         the GPU acceptance run, stages by name (--plan lists them): CUDA tests,
                124M vs build-nanogpt, XL, loss kernels, profiles, FP8, recipes, ladder
    cpu-malloc  the CPU step with and without --cpu-malloc-reuse

Every subcommand times with one helper (gpt.bench.timing.time_fn: warm-up, synchronised
or CUDA-event timing, all samples kept), records OOMs and errors per cell and goes on,
and writes a table to stdout plus ``<out>/<name>.json`` and ``<out>/<name>.md``.

The pieces the subcommands share, one home each: args (the shared flags, a standalone
subcommand's parser), common.Context (a timing run's device, defaults, guarded cells and
sweep), record (a result file's command, commit and time, written atomically), tables
(every table, text or markdown), runs (train_gpt2.py and fineweb.py as subprocesses).
"""
