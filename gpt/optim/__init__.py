"""The optimizers (one module each behind one interface: gpt/optim/kind.py), the learning-rate schedule."""
