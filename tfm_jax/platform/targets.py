"""Accelerators we compile for without having them: a small table of TPU slices and GPU nodes.

A target is named as users name their hardware: a TPU slice `v5e-16`, `v4-8`, `v5p-64`, `v6e-256`
(the count is what Cloud TPU's accelerator type counts: chips for v5e/v6e, TensorCores for v4/v5p,
two a chip), `2xv5e-16` for two slices; a GPU node `h100x8`, `h200x8`, `a100x8`, `4xh100x8` for
four nodes. `Target.devices()` gives compile-only devices of that topology (jax.experimental.
topologies): XLA then compiles the real program for it, partitioned over its chips, and reports
each chip's memory.

What it needs installed: libtpu for TPU targets (`pip install -e '.[tpu]'`), the CUDA PJRT plugin
without the CUDA libraries for GPU targets (`pip install -e '.[cuda12-compile]'`).

The numbers are the vendors' public figures for one chip: HBM, dense bf16 peak, HBM bandwidth.
f32 dots run as one bf16 pass on TPUs at JAX's default precision and as TF32 on these GPUs, so
`peak_flops("float32")` is that rate.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

GIB = 2**30


class TargetError(ValueError):
    """A target name we do not know, or a target whose compiler is not installed."""


@dataclasses.dataclass(frozen=True)
class Chip:
    kind: str  # the device_kind XLA reports
    platform: str  # "tpu" | "gpu"
    hbm_bytes: int
    bf16_flops: float  # dense, per chip
    f32_flops: float  # what an f32 dot runs at by default (TPU: one bf16 pass; GPU: TF32)
    hbm_bandwidth: float  # bytes/s
    cores_per_chip: int = 1  # what a TPU accelerator type's count counts per chip
    topology_dims: int = 2  # TPU: 2-D (v5e, v6e) or 3-D (v4, v5p) torus
    chip_config: str = "default"
    gpu_spec: str = ""  # GpuTargetConfigProto fields of the device (GPU targets)


# GPU device descriptions, as XLA's own spec files write them (xla/tools/hlo_opt/gpu_specs/):
# compute capability, SMs and their limits, memory and bandwidth.
_H100_SM = """
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  l2_cache_size: 52428800 clock_rate_ghz: 1.98 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536"""
_A100_SM = """
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 167936 threads_per_core_limit: 2048 core_count: 108 fpus_per_core: 64
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  l2_cache_size: 41943040 clock_rate_ghz: 1.41 shared_memory_per_block_optin: 166912
  cuda_compute_capability { major: 8 minor: 0 }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536"""

CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", "tpu", 32 * GIB, 275e12, 275e12, 1.2e12, 2, 3, "megacore"),
    "v5e": Chip("TPU v5 lite", "tpu", 16 * GIB, 197e12, 197e12, 8.19e11, 1, 2),
    "v5p": Chip("TPU v5", "tpu", 95 * GIB, 459e12, 459e12, 2.765e12, 2, 3, "megacore"),
    "v6e": Chip("TPU v6 lite", "tpu", 32 * GIB, 918e12, 918e12, 1.64e12, 1, 2),
    "h100": Chip("NVIDIA H100 80GB HBM3", "gpu", 84978434048, 989e12, 494e12, 3.35e12,
                 gpu_spec=_H100_SM),
    "h200": Chip("NVIDIA H200", "gpu", 150754820096, 989e12, 494e12, 4.8e12, gpu_spec=_H100_SM),
    "a100": Chip("NVIDIA A100-SXM4-80GB", "gpu", 85899345920, 312e12, 156e12, 2.039e12,
                 gpu_spec=_A100_SM),
}  # fmt: skip

GPU_MEM_FRACTION_DEFAULT = 0.75  # JAX preallocates this share of a GPU (XLA_PYTHON_CLIENT_...)


@dataclasses.dataclass(frozen=True)
class Target:
    name: str  # as the user typed it
    chip_name: str  # key of CHIPS
    chips: int  # per slice (TPU) or per node (GPU)
    slices: int = 1  # TPU slices, or GPU nodes

    @property
    def chip(self) -> Chip:
        return CHIPS[self.chip_name]

    @property
    def platform(self) -> str:
        return self.chip.platform

    @property
    def num_devices(self) -> int:
        return self.chips * self.slices

    def memory_budget(self) -> int:
        """Bytes a program may use on one chip: a TPU's HBM; on a GPU the share JAX preallocates
        (XLA_PYTHON_CLIENT_MEM_FRACTION, default 0.75), which is all the allocator hands out."""
        if self.platform == "tpu":
            return self.chip.hbm_bytes
        fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", GPU_MEM_FRACTION_DEFAULT))
        return int(self.chip.hbm_bytes * fraction)

    def peak_flops(self, dtype: str) -> float:
        return self.chip.bf16_flops if dtype == "bfloat16" else self.chip.f32_flops

    def tpu_topology(self) -> tuple[str, tuple[int, int, int]]:
        """("v5e:4x4", chips_per_host_bounds): the most square torus of this many chips."""
        dims = _torus(self.chips, self.chip.topology_dims)
        # Cloud TPU hosts hold 4 chips as 2x2 (a single 8-chip v5e/v6e host is 2x4)
        per_host = {1: (1, 1, 1), 2: (1, 2, 1)}.get(self.chips, (2, 2, 1))
        if self.chips == 8 and self.chip.topology_dims == 2:
            per_host = (2, 4, 1)
        return f"{self.chip_name}:{'x'.join(map(str, dims))}", per_host

    def devices(self) -> list:
        """Compile-only devices of this topology (nothing runs on them)."""
        from jax.experimental import topologies

        try:
            if self.platform == "tpu":
                name, per_host = self.tpu_topology()
                topo = topologies.get_topology_desc(
                    topology_name=name,
                    platform="tpu",
                    chip_config_name=self.chip.chip_config,
                    chips_per_host_bounds=per_host,
                    num_slices=self.slices,
                )
            else:
                spec = (
                    f"gpu_device_info {{{self.chip.gpu_spec}\n"
                    f"  memory_bandwidth: {int(self.chip.hbm_bandwidth)}\n"
                    f"  device_memory_size: {self.chip.hbm_bytes}\n}}\n"
                    f'platform_name: "CUDA"\ndevice_description_str: "{self.chip.kind}"\n'
                )
                topo = topologies.get_topology_desc(
                    "aot", "cuda", target_config=spec, topology=f"1x{self.slices}x{self.chips}"
                )
        except Exception as e:  # noqa: BLE001  (the plugin is missing or refuses: say which)
            raise TargetError(self.missing_compiler(e)) from None
        return list(topo.devices)

    def missing_compiler(self, e: BaseException) -> str:
        extra = "tpu" if self.platform == "tpu" else "cuda12-compile"
        return (
            f"--target={self.name}: no {self.platform.upper()} compiler in this environment "
            f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}). Install it "
            f"with: pip install -c constraints.txt -e '.[{extra}]'"
        )


def _torus(chips: int, dims: int) -> tuple[int, ...]:
    """The most square dims-D shape of `chips` chips (powers of two), x <= y <= z."""
    if chips < 1 or chips & (chips - 1):
        raise TargetError(f"{chips} chips: TPU slices come in powers of two")
    exps = [0] * dims
    for i in range(int(math.log2(chips))):
        exps[i % dims] += 1  # round-robin: 16 chips -> 4x4 (2-D), 2x2x4 (3-D)
    shape = sorted(2**e for e in exps)
    if dims == 3 and chips < 8:  # v4-8 / v5p-8: 4 chips are a 2x2x1 slab, not 1x2x2
        shape = shape[1:] + [1]
    return tuple(shape)


_NAME = re.compile(r"^(?:(\d+)x)?(v4|v5e|v5p|v6e)-(\d+)$|^(?:(\d+)x)?(h100|h200|a100)x(\d+)$")


def parse_target(name: str) -> Target:
    """`v5e-16`, `2xv5e-16`, `v4-8`, `h200x8`, `4xh100x8`, ... -> Target; a TargetError says
    what is known otherwise."""
    m = _NAME.match(name.strip().lower())
    if not m:
        raise TargetError(
            f"--target={name!r}: not a known target. TPU slices: v4-N, v5p-N (N TensorCores, two "
            "a chip), v5e-N, v6e-N (N chips), optionally 'Kx' for K slices (2xv5e-16); GPU "
            "nodes: h100x8, h200x8, a100x8, optionally 'Kx' for K nodes (4xh100x8)"
        )
    if m.group(2):
        slices, chip_name, count = int(m.group(1) or 1), m.group(2), int(m.group(3))
        per_chip = CHIPS[chip_name].cores_per_chip
        if count % per_chip:
            raise TargetError(f"--target={name}: {chip_name} counts {per_chip} cores a chip")
        chips = count // per_chip
        _torus(chips, CHIPS[chip_name].topology_dims)  # a power of two, or a TargetError
    else:
        slices, chip_name, chips = int(m.group(4) or 1), m.group(5), int(m.group(6))
    if slices < 1 or chips < 1:
        raise TargetError(f"--target={name}: counts must be >= 1")
    return Target(name=name, chip_name=chip_name, chips=chips, slices=slices)
