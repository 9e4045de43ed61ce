"""The command line, `python -m tfm_jax <command>`: training commands in main.py, decoding and
evaluation commands in inference.py. Nothing outside this folder imports it."""
