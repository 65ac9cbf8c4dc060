"""The optimizers: AdamW's decay groups, Muon, the learning-rate schedule."""
