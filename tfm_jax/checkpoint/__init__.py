"""Checkpoints on Orbax: save, restore and resume a run (manager.py), the paper's average of the
last checkpoints (averaging.py, §6), the workdir's layout and reading from it (layout.py), and
the errors (errors.py)."""
