"""Train GPT-2: `python train_gpt2.py --help` lists every flag.

A thin entry point (gpt/entry.py): the run from start to end is gpt/train/trainer.py, and
the training loop, as the algorithm reads, gpt/train/loop.py.
"""

from gpt.entry import train_main

if __name__ == "__main__":
    raise SystemExit(train_main())
