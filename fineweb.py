"""Prepare GPT-2 token shards for train_gpt2.py: `python fineweb.py --help`.
The command line is gpt/data/prepare/cli.py; the pipeline, gpt/data/prepare/."""

from gpt.data.prepare.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
