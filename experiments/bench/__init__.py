"""Benchmarks, one module per kind: `python -m experiments.bench [peak|train_step|decode|input]`
(cli.py) prints one JSON line per benchmark.

  progress.py        what every benchmark prints: JSON records, timestamped progress lines
  peak.py            the matmul peak, the denominator of MFU
  step.py            train-step throughput, MFU, memory and compile time, round-robin variants
  decode.py          beam-4 and greedy decoding speed (also `python -m experiments.bench.decode`)
  input_pipeline.py  the input pipeline's batches/s, and at WMT scale with --scale
  compile_table.py   every Table 3 row's train step compiled for TPU slices and GPU nodes

Nothing here imports JAX: __main__.py sets XLA_FLAGS and the malloc tunables before it does.
"""
