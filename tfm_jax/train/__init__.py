"""Training (§5): the train state and its jitted, sharded step (trainer.py), the optimizer and
schedule, losses, dropout bits, the loop with its logging, preemption and resume checks."""
