"""The platform seam: the one place that asks which backend JAX runs on, and what follows from it.

Every entry point calls `init_runtime(cfg)` once (as MaxText's trainers do); the model, the step
and the decoder then read the same on every backend. What it decides:

- bf16 x bf16 -> f32 products (`platform.product`): on CPU `cpu.canonical_product` (the one
  layout YNNPACK runs); elsewhere one einsum with `preferred_element_type`. The model carries
  the choice (scoring.make_model resolves it for the devices it is compiled for): no global.
- dropout bits (`train.dropout_prng="auto"`): on CPU `threefry_fused` (prng.py, 1.18x the base
  step); elsewhere `threefry`, JAX's own lowering. The same bits either way.
- malloc tunables (host.py, before JAX starts): CPU hosts only.
- decoding devices (`--cpu_devices`): on CPU one JAX device per core; elsewhere the accelerators.
- the persistent compilation cache (`platform.compilation_cache`): on every backend.

CPU-only code is in cpu.py and host.py, each switchable, its tests marked `cpu_only`. GPU and TPU
choices are the portable ones until measured there (experiments/gpu_check.sh).
"""

from tfm_jax.platform.products import plain_product
from tfm_jax.platform.runtime import (
    DROPOUT_PRNGS,
    PRODUCTS,
    Runtime,
    backend,
    default_cache_dir,
    dropout_prng,
    init_runtime,
    platform_of,
    product_function,
    resolve_product,
    split_cpu_devices,
)

__all__ = [
    "DROPOUT_PRNGS",
    "PRODUCTS",
    "Runtime",
    "backend",
    "default_cache_dir",
    "dropout_prng",
    "init_runtime",
    "plain_product",
    "platform_of",
    "product_function",
    "resolve_product",
    "split_cpu_devices",
]
