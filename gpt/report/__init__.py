"""What a run measures and shows: FLOPs, MFU, memory, the metrics log and trackers, the profiler, the curves."""
