"""`python -m gpt.bench prepare`: shard preparation's throughput and memory against a
multiprocessing.Pool baseline. The parent (throughput.py) builds the inputs, runs each
measurement in a fresh child process (child.py, torch-free) and samples its memory."""
