"""Where a process runs: the torchrun launch, the world of ranks and its collectives, the device and its precision."""
