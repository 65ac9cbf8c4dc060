"""`python -m gpt.evaluate`: lm-evaluation-harness tasks, HellaSwag accuracy and validation
loss (with bits per byte) of a checkpoint or GPT-2.

    python -m gpt.evaluate --checkpoint ckpt.pt --tasks hellaswag,arc_easy,piqa,winogrande,lambada_openai
    python -m gpt.evaluate --init-from gpt2 --tasks hellaswag --limit 500
    python -m gpt.evaluate --checkpoint runs/x/ckpt_019073.pt --hellaswag hellaswag_val.jsonl
    python -m gpt.evaluate --init-from gpt2 --hellaswag val              # downloads the set
    python -m gpt.evaluate --checkpoint ckpt.pt --data-dir data/fineweb-edu-10B --val-steps 20
    torchrun --standalone --nproc_per_node=8 -m gpt.evaluate --checkpoint ckpt.pt --hellaswag val

Under torchrun each rank scores its share (the harness's requests by its rank / world-size
contract, HellaSwag examples i % world_size, disjoint validation windows) and the results
are combined; rank 0 prints them. The scoring is gpt/eval/harness.py's (through the harness),
gpt/eval/hellaswag.py's and gpt/eval/validation.py's; the flags are parsed before torch is imported.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpt.core.cli import OneLineParser, check_at_least_one
from gpt.core.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m gpt.evaluate",
                      description="Score a checkpoint or OpenAI GPT-2 on HellaSwag and/or "
                      "validation loss.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", metavar="PATH", help="a checkpoint written by the trainer")
    src.add_argument("--init-from", metavar="NAME|DIR",
                     help="gpt2, gpt2-medium, gpt2-large, gpt2-xl or a Hugging Face GPT-2 folder")
    t = p.add_argument_group("lm-evaluation-harness (the eval extra)")
    t.add_argument("--tasks", metavar="LIST",
                   help="harness tasks, comma-separated, e.g. hellaswag,arc_easy,piqa,"
                   "winogrande,lambada_openai (their data comes from the Hugging Face Hub)")
    t.add_argument("--limit", type=int, default=None, help="score only the first N examples of each task")
    t.add_argument("--include-path", metavar="DIR", help="a folder of task YAMLs of your own")
    t.add_argument("--tasks-batch-size", type=int, default=16, help="requests per forward")
    t.add_argument("--tasks-progress", action="store_true",
                   help="show the harness's and datasets' progress bars (default: one line "
                   "per run of the tasks)")
    h = p.add_argument_group("HellaSwag (this package's own scoring)")
    h.add_argument("--hellaswag", metavar="FILE|URL|val",
                   help="HellaSwag jsonl: a local file, a URL, or 'val' for the official "
                   "validation set (downloaded once into --cache-dir)")
    h.add_argument("--hellaswag-max-examples", type=int, default=None,
                   help="score only the first N examples")
    h.add_argument("--batch-examples", type=int, default=8,
                   help="examples per forward (x 4 candidates)")
    h.add_argument("--cache-dir", default=None,
                   help="where downloads go (default: ~/.cache/gpt2-trainer/hellaswag)")
    v = p.add_argument_group("validation loss")
    v.add_argument("--data-dir", help="folder of val_* token shards")
    v.add_argument("--val-steps", type=int, default=20, help="batches per process")
    v.add_argument("--batch-size", type=int, default=8)
    v.add_argument("--seq-len", type=int, default=None, help="default: the model's block size")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "mps", "cpu"])
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="autocast precision; auto: bf16 on CUDA/MPS, fp32 on CPU")
    p.add_argument("--compile", action="store_true", help="torch.compile the model first")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    return p


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.hellaswag is None and args.data_dir is None and args.tasks is None:
        parser.error("nothing to do: give --tasks LIST, --hellaswag FILE and/or --data-dir DIR")
    if args.data_dir == "":
        parser.error("--data-dir must not be empty (it would be the current folder); name the "
                     "folder of the val_* shards ('.' if it is this one)")
    if args.tasks is not None and not any(t.strip() for t in args.tasks.split(",")):
        parser.error(f"--tasks {args.tasks!r} names no task: give a comma-separated list, "
                     f"e.g. hellaswag,arc_easy")
    check_at_least_one(parser, args, ("batch_examples", "val_steps", "batch_size", "seq_len",
                                      "hellaswag_max_examples", "limit", "tasks_batch_size"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate as the arguments say (one process or one torchrun rank); results dict."""
    import torch  # only once the flags are good: --help answers at once

    from gpt.checkpoint.weights import load_model
    from gpt.core.config import ConfigError
    from gpt.data.loader import ShardLoader
    from gpt.data.tokenizer import GPT2_VOCAB
    from gpt.eval import bpb, harness_tasks, hellaswag
    from gpt.eval.validation import val_loss
    from gpt.model.sizing import check_free_memory
    from gpt.runtime.device import resolve_dtype
    from gpt.runtime.world import all_reduce_mean, init_runtime, shutdown

    runtime = init_runtime(args.device)
    try:
        dtype = resolve_dtype(args.dtype, runtime.device)
        model = load_model(checkpoint=args.checkpoint, init_from=args.init_from,
                           device=runtime.device)
        scored = torch.compile(model) if args.compile else model
        results: dict[str, Any] = {"source": args.checkpoint or args.init_from}
        if args.tasks is not None:
            from gpt.eval.harness import GPT2TrainerLM

            tasks, failed = harness_tasks.load_tasks(harness_tasks.parse_tasks(args.tasks),
                                                     args.include_path)
            if failed and runtime.rank == 0:
                print("\n".join(f"error: {line}" for line in failed), file=sys.stderr)
            if failed:
                raise harness_tasks.HarnessError(f"{len(failed)} of the --tasks could not be "
                                                 f"loaded (see above)")
            lm = GPT2TrainerLM(model=model, dtype=dtype, batch_size=args.tasks_batch_size,
                               rank=runtime.rank, world_size=runtime.world_size,
                               quiet=not args.tasks_progress)
            if runtime.rank == 0:  # in place of the progress bars (stdout: the results alone)
                print(f"scoring {', '.join(harness_tasks.parse_tasks(args.tasks))} with "
                      f"lm-evaluation-harness ...", file=sys.stderr, flush=True)
            results["tasks"] = harness_tasks.run_tasks(lm, tasks, args.limit)
        if args.hellaswag is not None:
            examples = hellaswag.load_examples(args.hellaswag, args.cache_dir, runtime.rank,
                                               max_examples=args.hellaswag_max_examples)
            # a forward's rows: 4 a example, no more examples than a rank scores
            rows = 4 * min(args.batch_examples, -(-len(examples) // runtime.world_size))
            width = hellaswag.pad_length(examples, model.config.block_size)
            check_free_memory(rows * width * model.config.vocab_size * 4, runtime.device,
                              f"--batch-examples {args.batch_examples:,} (forwards of "
                              f"{rows:,} rows x {width} tokens: their fp32 logits)",
                              "lower --batch-examples")
            results["hellaswag"] = {"set": examples.name, **hellaswag.evaluate(
                scored, examples, runtime.device, dtype, runtime.rank, runtime.world_size,
                batch_examples=args.batch_examples, valid_vocab=GPT2_VOCAB)}
        if args.data_dir is not None:
            seq_len = args.seq_len or model.config.block_size
            if seq_len > model.config.block_size:
                raise ConfigError(f"--seq-len {seq_len} exceeds the model's block size "
                                  f"{model.config.block_size}")
            per_token = 8 + 4 * model.config.n_embd + (
                0 if model.chunked_loss else 4 * model.config.vocab_size)  # ids, a layer, logits
            check_free_memory(args.batch_size * seq_len * per_token, runtime.device,
                              f"--batch-size {args.batch_size:,} (forwards of {args.batch_size:,} "
                              f"rows x {seq_len} tokens)", "lower --batch-size")
            loader = ShardLoader(args.data_dir, "val", args.batch_size, seq_len,
                                 rank=runtime.rank, world_size=runtime.world_size,
                                 device=runtime.device, max_token=model.config.vocab_size - 1)
            steps = min(args.val_steps, loader.steps_per_pass)
            loss, per_token = all_reduce_mean(
                val_loss(scored, loader, steps, runtime.device_type, dtype,
                         bpb.token_bytes(model.config.vocab_size, runtime.device)), runtime).tolist()
            results["val_loss"] = loss
            results["val_bpb"] = bpb.bits_per_byte(loss, per_token)
            results["val_tokens"] = steps * args.batch_size * seq_len * runtime.world_size
        results["is_master"] = runtime.rank == 0
        return results
    finally:
        shutdown(runtime, clean=False)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)

    try:
        if args.tasks is not None:
            from gpt.eval.harness_tasks import quiet_progress, require_lm_eval

            # before torch and the model: a missing extra is named in a moment, not seconds
            if not args.tasks_progress:
                quiet_progress()  # before lm-eval and datasets are imported: they read it then
            require_lm_eval("--tasks")
        results = run(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if not results.pop("is_master"):
        return 0
    if args.json:
        print(json.dumps(results))
        return 0
    if "hellaswag" in results:
        r = results["hellaswag"]
        from gpt.core.text import one_line

        # the official validation set by its name alone; a set of one's own by its source
        named = "" if r["set"] == "val" else f" ({one_line(r['set'], 200)})"
        print(f"hellaswag{named}: acc {r['acc']:.4f} ({r['correct']}/{r['total']}) | acc_norm "
              f"{r['acc_norm']:.4f} ({r['correct_norm']}/{r['total']})")
    if "val_loss" in results:
        print(f"val loss: {results['val_loss']:.4f} | {results['val_bpb']:.4f} bits/byte "
              f"({results['val_tokens']:,} tokens)")
    if "tasks" in results:
        from gpt.eval.gpt2_scores import comparison_lines

        print("\n".join(comparison_lines(results["tasks"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
