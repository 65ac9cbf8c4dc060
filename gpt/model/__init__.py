"""The model: GPT-2 and its options, its size by arithmetic, the fused head and loss kernels, FP8."""
