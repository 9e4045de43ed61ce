"""Configs: every default (defaults.py, data.py), building one from a file or a run's saved
config plus overrides (build.py), the one validation (validate.py), and the paths a user typed,
resolved once (paths.py)."""
