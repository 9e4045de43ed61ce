"""`python -m tfm_jax ...`: the command line (tfm_jax/cli/)."""

import sys

if __name__ == "__main__":  # before JAX is imported: see platform/host.py
    from tfm_jax.platform import host

    host.reexec_with_malloc_tunables(["-m", "tfm_jax", *sys.argv[1:]])

    from tfm_jax.cli.main import main

    sys.exit(main())
