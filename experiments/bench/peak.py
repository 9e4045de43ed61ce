"""The matmul peak, the denominator of MFU: a large square product per dtype, compiled once and
timed between other measurements (the machine may be shared, so it is re-timed beside each
step rather than measured once)."""

import functools
import time

import jax
import jax.numpy as jnp

from experiments.bench.progress import median, progress


def default_peak_size() -> int:
    return 8192 if jax.default_backend() == "gpu" else 2048


class Peak:
    """A large square jnp.dot per dtype, compiled once, timable between other measurements."""

    def __init__(self, n: int | None = None):
        self.n = n or default_peak_size()
        self.fns = {}
        progress(f"peak: compiling {self.n}^3 products (f32, bf16) on {jax.devices()[0]}")
        key = jax.random.PRNGKey(0)
        # bf16: bf16 operands, float32 accumulation and result, the product the model's bf16
        # compute uses (tfm_jax/model/matmul.py) and the hardware's bf16 rate; a bf16-result dot is
        # upcast to f32 by XLA:CPU, so it would measure the f32 units.
        dot = functools.partial(jnp.dot, preferred_element_type=jnp.float32)
        for name, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
            a = jax.random.normal(key, (self.n, self.n), dtype)
            f = jax.jit(dot).lower(a, a).compile()
            jax.block_until_ready(f(a, a))  # warm-up
            self.fns[name] = (f, a)

    def flops_per_s(self, name: str, reps: int = 1) -> float:
        """Best of `reps` timed products (best, not median: it is a ceiling)."""
        f, a = self.fns[name]
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            jax.block_until_ready(f(a, a))
            best = min(best, time.perf_counter() - start)
        return 2.0 * self.n**3 / best


def bench_peak(peak: Peak, reps: int) -> dict:
    progress(f"peak: timing {reps} reps")
    f32 = [peak.flops_per_s("f32") for _ in range(reps)]
    bf16 = [peak.flops_per_s("bf16") for _ in range(reps)]
    return {
        "bench": "peak",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "n": peak.n,
        "f32_flops": median(f32),
        "bf16_flops": median(bf16),
        "reps": reps,
    }
