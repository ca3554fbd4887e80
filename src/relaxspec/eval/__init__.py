"""Measuring: datasets, the code sandbox, the benchmark grid and its peers, results and reports,
the three papers' diagnostics, model evaluation, the SDD operating-point sweep and the theory
report over real generations (docs/design.md §6). Builds on ``methods`` and the engine below it."""
