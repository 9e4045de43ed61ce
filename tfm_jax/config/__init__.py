"""Configs: the defaults (core.py), building one from a file and overrides (build.py), and the
paths a user typed, resolved once (paths.py)."""
