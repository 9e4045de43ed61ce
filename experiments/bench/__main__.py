"""`python -m experiments.bench ...`: the benchmarks' command line (cli.py), started as `python -m
tfm_jax` is: re-executed once with the CPU malloc tunables (tfm_jax/platform/host.py), and
--devices=N put into XLA_FLAGS, both before JAX is imported."""

import os
import sys
import time


def preparse_devices(argv: list[str]) -> None:
    """--devices=N must reach XLA_FLAGS before jax is imported (the CPU client reads it once)."""
    for arg in argv:
        if arg.startswith("--devices="):
            n = int(arg.split("=", 1)[1])
            if n > 1:
                flags = os.environ.get("XLA_FLAGS", "")
                os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}"


if __name__ == "__main__":
    # Progress stamps count from gpu_check.sh's start where it exports BENCH_T0, else from here;
    # the environment carries the stamp across the malloc re-exec below.
    os.environ.setdefault("BENCH_T0", repr(time.time()))
    from tfm_jax.platform import host

    host.reexec_with_malloc_tunables(["-m", "experiments.bench", *sys.argv[1:]])
    preparse_devices(sys.argv[1:])

    from experiments.bench.cli import main

    sys.exit(main())
