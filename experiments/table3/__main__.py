"""`python -m experiments.table3 ...`: the Table 3 sweep's command line (sweep.py)."""

import sys

from experiments.table3.sweep import main

if __name__ == "__main__":
    sys.exit(main())
