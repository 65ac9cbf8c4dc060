"""``python -m gpt.bench SUBCOMMAND [flags]``; ``--help`` lists the subcommands."""

from gpt.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
