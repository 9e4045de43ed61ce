"""Experiments on top of the library, a package like tfm_jax: table3/ (the Table 3 sweep: its
runner, presets built from configs/, statistics, evidence and report) and bench/ (one module per
benchmark), beside the shell scripts (quickstart.sh, gpu_check.sh, ...) and results/.

Run from the checkout's root, as `python -m experiments.table3 ...` and
`python -m experiments.bench ...`; the modules import each other as `experiments.*`.
"""

import os

# The checkout's root: configs/ and runs/ are found from here, and `python -m tfm_jax` runs here.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
