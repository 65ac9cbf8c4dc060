"""The training run: the loop, the run's parts, what it records and says, its curves, signals, --eval-tasks."""
