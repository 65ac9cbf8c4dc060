"""Benchmark suite: ``python -m gpt.bench SUBCOMMAND`` (see benchmarks/README.md).

Subcommands:
    model       sizes x context x batch x {fwd, fwdbwd, step} x {fp32, tf32, bf16} x compile
    components  embeddings, transformer blocks and head+loss timed separately
    attention   naive vs SDPA backends (flash, efficient, cuDNN, math) vs compiled naive
    ladder      the GPT-2 speed ladder, each optimisation on top of the last
    compile     eager vs torch.compile (attention and whole model), compile time apart
    comm        all-reduce bandwidth, DDP compute vs communication (under torchrun)
    cpu-malloc  the CPU step with and without --cpu-malloc-reuse
    memory      the memory planner's prediction of a run's peak memory per device
    prepare     fineweb.py's shard preparation vs a multiprocessing.Pool baseline
    tokens      tokens and seconds each recipe needs to reach the GPT-2 recipe's loss
    newton-schulz  Muon's orthogonalisation in fp32 vs bf16
    gpu         the GPU acceptance run, stages by name (--plan lists them): CUDA tests,
                124M vs build-nanogpt, XL, loss kernels, profiles, FP8, recipes, ladder

The parts, one folder each:
    step/       the training step and its parts on one machine: the timing subcommands
                (model, components, attention, compile, ladder), comm, cpu-malloc, memory
    tokens/     the tokens bench and its recipes; newton-schulz
    prepare/    shard preparation's throughput (a parent and its measured children)
    gpu/        the GPU acceptance run: its stages, plan, estimates, inputs and results

What the parts share stays here, one home each, and never imports a part: args (the shared
flags, a standalone subcommand's parser), record (a result file's command, commit and time,
written atomically), tables (every table, text or markdown), runs (train_gpt2.py and
fineweb.py as subprocesses), timing (the one timing helper, gpt.bench.timing.time_fn:
warm-up, synchronised or CUDA-event timing, all samples kept, OOM guards), report (a run's
header and sections) and trace_summary (where a profiled step's GPU time goes, also
``python -m gpt.bench.trace_summary TRACE``). cli is the command line: it names each
subcommand's module and imports it only when that subcommand is asked for.

Every timing subcommand records OOMs and errors per cell and goes on, and writes a table to
stdout plus ``<out>/<name>.json`` and ``<out>/<name>.md``.
"""
