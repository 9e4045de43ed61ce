"""Checkpoints on Orbax: save, restore and resume a run (manager.py), and the paper's average of
the last checkpoints (§6)."""
