"""The platform seam's decisions (see the package docstring): which backend runs, what "auto"
resolves to for a target, the persistent compilation cache, and `init_runtime`, which every
entry point calls once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from tfm_jax.platform.products import plain_product

log = logging.getLogger(__name__)

PRODUCTS = ("auto", "einsum", "cpu_canonical")
DROPOUT_PRNGS = ("auto", "threefry_fused", "threefry", "rbg", "unsafe_rbg")


def backend() -> str:
    """ "cpu", "gpu" or "tpu": the only `jax.default_backend()` call in tfm_jax/."""
    import jax

    return jax.default_backend()


@dataclasses.dataclass
class Runtime:
    """What `init_runtime` resolved for this process."""

    backend: str
    product: str  # "einsum" | "cpu_canonical"
    compilation_cache_dir: str | None


def platform_of(devices) -> str:
    """ "cpu", "gpu" or "tpu": the platform of the devices a program is compiled for, which may
    not be the host's (compile-only devices of a TPU topology on a CPU host, platform/targets.py).
    """
    names = {d.platform for d in devices}
    if len(names) != 1:
        raise ValueError(f"devices of several platforms: {sorted(names)}")
    name = names.pop()
    return "gpu" if name in ("cuda", "rocm") else name


def resolve_product(name: str, target: str | None = None) -> str:
    """`platform.product` with "auto" resolved for `target` (default: this process's backend):
    "cpu_canonical" on CPU, "einsum" elsewhere. The model carries the result (Transformer's
    `product`), set by scoring.make_model for the devices its program is compiled for."""
    if name not in PRODUCTS:
        raise ValueError(f"platform.product={name!r}: use one of {', '.join(PRODUCTS)}")
    if name == "auto":
        return "cpu_canonical" if (target or backend()) == "cpu" else "einsum"
    return name


def product_function(name: str) -> Callable:
    """The bf16 x bf16 -> f32 product implementation `name` ("einsum", "cpu_canonical")."""
    if resolve_product(name) == "cpu_canonical":
        from tfm_jax.platform import cpu

        return cpu.canonical_product
    return plain_product


def dropout_prng(name: str, target: str | None = None) -> str:
    """`train.dropout_prng` with "auto" resolved for `target` (default: the host's backend):
    threefry_fused on CPU, threefry elsewhere.

    Both draw the same bits (tests/unit/test_prng.py), so "auto" never changes a run's numbers.
    """
    if name not in DROPOUT_PRNGS:
        raise ValueError(f"train.dropout_prng={name!r}: use one of {', '.join(DROPOUT_PRNGS)}")
    if name != "auto":
        return name
    return "threefry_fused" if (target or backend()) == "cpu" else "threefry"


def default_cache_dir() -> str:
    """$XDG_CACHE_HOME/tfm_jax/xla (default ~/.cache/tfm_jax/xla)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "tfm_jax", "xla")


def _setup_compilation_cache(setting: str) -> str | None:
    """Points JAX's persistent compilation cache at `setting` ("auto", "" = off, or a folder)."""
    import jax

    if not setting:
        jax.config.update("jax_compilation_cache_dir", None)  # off, even after an earlier call
        return None
    directory = default_cache_dir() if setting == "auto" else setting
    if "://" not in directory:
        directory = os.path.abspath(os.path.expanduser(directory))
        os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    # Cache every program that took over a second to compile (unless the environment says
    # otherwise), whatever its size.
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    # Unbounded, as JAX's default (a size cap needs the `filelock` package): delete the folder
    # to clear it.
    return directory


def split_cpu_devices(n: int | None) -> None:
    """Decoding: split a CPU host into n JAX devices (None = one per core, cpu.py); a no-op on
    accelerator hosts and for n=1. Only before JAX starts its backends, so before init_runtime."""
    if n == 1:
        return
    from tfm_jax.platform import cpu, host

    if not host.has_accelerator():
        cpu.split_cpu_devices(n)


def init_runtime(cfg: Any = None, target: str | None = None) -> Runtime:
    """Resolves and applies this process's platform choices; call once, before any step runs.

    cfg: a config with a `platform` section (product, compilation_cache), or None for the
    defaults. target: the platform the programs are compiled for ("cpu", "gpu", "tpu") when it
    is not the host's backend (`python -m tfm_jax compile --target=...` on a CPU host); "auto"
    choices then resolve for it.
    """
    settings = getattr(cfg, "platform", None) if cfg is not None else None
    product_setting = settings.product if settings is not None else "auto"
    cache_setting = settings.compilation_cache if settings is not None else "auto"
    cache_dir = _setup_compilation_cache(cache_setting)
    runtime = Runtime(target or backend(), resolve_product(product_setting, target), cache_dir)
    log.debug("platform: %s", runtime)
    return runtime
