"""Decoding (§6.1): beam and greedy search as pure functions (search.py), a run's model and
vocabulary (load.py), and batched translation of text (translate.py)."""
