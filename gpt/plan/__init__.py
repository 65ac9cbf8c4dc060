"""Before a run: the preflight (will it start, and what will it do), the dry run, the memory planner, the automatic layout, what a run should take."""
