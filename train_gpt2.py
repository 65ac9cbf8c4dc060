"""Train GPT-2: `python train_gpt2.py --help` lists every flag.

A thin entry point; the trainer lives in gpt/train/loop.py.
"""

from gpt.entry import train_main

if __name__ == "__main__":
    raise SystemExit(train_main())
