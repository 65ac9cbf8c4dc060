"""The model made ready to train and stepped: compiled, recomputing, spread over the ranks (DDP, ZeRO-1, FSDP2), and one optimizer step over the micro-batches."""
