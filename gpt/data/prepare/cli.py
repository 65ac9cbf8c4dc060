"""fineweb.py's command line: prepare GPT-2 token shards for train_gpt2.py.

    python fineweb.py                                    # FineWeb-Edu sample-10BT -> data/fineweb-edu-10B
    python fineweb.py --streaming --max-tokens 1B        # its first 1B tokens, without downloading it all
    python fineweb.py --source ./my_texts/*.jsonl --out data/mine
    python fineweb.py --source demo --out data/shakespeare --val-tokens 30000    # tiny shakespeare, shipped

Sources: a Hugging Face dataset name (with --subset, --split, --text-field), or local .txt,
.jsonl/.json (also .gz) and .parquet files, globs and folders (no network needed). Every
document is preceded by GPT-2's end-of-text token. The first --val-tokens tokens go to
val_* shards, the rest to train_* shards; metadata.json describes them. Re-running the same
command resumes an interrupted run; --overwrite starts over. Counts accept 100M, 1.5B, 1e9.
"""

from __future__ import annotations

import argparse
import sys

from gpt.core.cli import OneLineParser
from gpt.core.errors import UserError
from gpt.data.prepare.config import (DEFAULT_DATASET, DEFAULT_OUT, DEFAULT_SHARD_TOKENS,
                                     DEFAULT_SUBSET, DEFAULT_VAL_TOKENS, VAL_SHARE, PrepareConfig,
                                     parse_count)
from gpt.data.prepare.run import prepare


def _count(text: str) -> int:
    try:
        return parse_count(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="fineweb.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_argument_group("input")
    src.add_argument("--source", nargs="+", default=[DEFAULT_DATASET], metavar="SRC",
                     help="local files, globs or folders (.txt, .jsonl, .json, .parquet, .gz), one "
                          "Hugging Face dataset name (optionally as hf:NAME), or 'demo' for the tiny "
                          f"shakespeare corpus the package ships (default: {DEFAULT_DATASET})")
    src.add_argument("--subset", default=None,
                     help=f"HF dataset subset/config (default: {DEFAULT_SUBSET} for {DEFAULT_DATASET})")
    src.add_argument("--split", default="train", help="HF dataset split (default: train)")
    src.add_argument("--text-field", default="text",
                     help="field with the text in .jsonl/.json/.parquet and HF records (default: text)")
    src.add_argument("--streaming", action="store_true",
                     help="HF datasets: stream instead of downloading everything first (the ETA "
                          "then needs --max-tokens or sizes on the dataset card); local files are "
                          "always streamed")
    src.add_argument("--txt-split-on-blank-lines", action="store_true",
                     help=".txt files: one document per blank-line-separated paragraph "
                          "(default: one document per file)")
    out = p.add_argument_group("output")
    out.add_argument("--out", default=DEFAULT_OUT, help=f"folder for the shards (default: {DEFAULT_OUT})")
    out.add_argument("--val-tokens", type=_count, default=None,
                     help=f"the first N tokens go to val_* shards (default: {DEFAULT_VAL_TOKENS:,} = one "
                          f"20-step validation at B=64, T=1024 on 8 GPUs, or a tenth of an input of "
                          f"fewer than {VAL_SHARE * DEFAULT_VAL_TOKENS:,} tokens; 0: no validation split)")
    out.add_argument("--shard-tokens", type=_count, default=DEFAULT_SHARD_TOKENS,
                     help=f"tokens per shard (default: {DEFAULT_SHARD_TOKENS:,})")
    out.add_argument("--max-tokens", type=_count, default=None,
                     help="stop after N tokens in all (val + train); default: the whole input")
    out.add_argument("--overwrite", action="store_true",
                     help="delete the shards and metadata.json already in --out and start over "
                          "(default: resume a run with the same settings, refuse other data)")
    run = p.add_argument_group("run")
    run.add_argument("--workers", type=int, default=0,
                     help="tokenizer processes (default 0: one per CPU core); the output is the same for any number")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.val_tokens or 0) < 0 or args.shard_tokens < 1 or args.workers < 0:
        parser.error("--val-tokens must be >= 0, --shard-tokens >= 1 and --workers >= 0")
    if args.max_tokens is not None and args.max_tokens < 1:
        parser.error("--max-tokens must be >= 1")
    cfg = PrepareConfig(
        sources=tuple(args.source),
        out_dir=args.out,
        val_tokens=args.val_tokens,
        shard_tokens=args.shard_tokens,
        max_tokens=args.max_tokens,
        subset=args.subset,
        split=args.split,
        text_field=args.text_field,
        streaming=args.streaming,
        txt_split_on_blank_lines=args.txt_split_on_blank_lines,
        workers=args.workers,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    try:
        result = prepare(cfg)
    except UserError as e:  # PrepareError, a shard that cannot be written (disk full), ...
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted: finished shards are kept; run the same command again to resume",
              file=sys.stderr)
        return 130
    if result.note:
        print(f"note: {result.note}", file=sys.stderr)
    kept = f" ({result.kept_shards} kept from an earlier run)" if result.kept_shards else ""
    print(
        f"{result.out_dir}: {len(result.shards)} shards{kept}, {result.val_tokens:,} val + "
        f"{result.train_tokens:,} train tokens, {result.documents:,} documents, "
        f"{result.seconds:.1f}s"
    )
    return 0

