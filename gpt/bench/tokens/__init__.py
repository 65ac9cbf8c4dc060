"""The tokens bench, `python -m gpt.bench tokens`: tokens and seconds the speedrun-era recipe
needs to reach the GPT-2 recipe's validation loss. The search over recipes, rates and the
ablation (search.py) and its budgets (budgets.py), its flags and arithmetic (bench.py), its
runs (runner.py) and their cache (cache.py), its timing phase (timing.py), its report
(report.py), and the recipes compared (recipes.py). Beside it, `newton-schulz`
(newton_schulz.py) times Muon's orthogonalisation on the bench's matrix shapes."""
