"""What a run states about its platform in its first lines, and the device memory its progress
line shows.

The first lines (`run_header`) name the backend and chip, this process among all, the devices
(global and local), the mesh, the compute dtype and whether the hardware computes it natively,
and the memory each device has. Memory comes from `Device.memory_stats()` (GPUs and TPUs); a
CPU device has none, so there it is the host's memory and the progress line shows RSS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

GiB = 2**30


def device_memory(devices: Sequence) -> dict[str, int] | None:
    """{"device_bytes", "device_peak_bytes", "device_limit_bytes"} over these devices (the most
    any one uses, the most any one peaked at, the smallest budget), from `memory_stats()`; None
    where the devices keep no statistics (CPU)."""
    stats = [s for s in (d.memory_stats() for d in devices) if s]
    if not stats:
        return None
    return {
        "device_bytes": max(int(s.get("bytes_in_use", 0)) for s in stats),
        "device_peak_bytes": max(int(s.get("peak_bytes_in_use", 0)) for s in stats),
        "device_limit_bytes": min(int(s.get("bytes_limit", 0)) for s in stats),
    }


def bf16_native(backend: str, device, cpu_has_bf16: bool | None) -> bool | None:
    """Whether this hardware multiplies bf16 natively: TPUs do, NVIDIA GPUs from compute
    capability 8.0 (A100), CPUs with AVX512-BF16 / AMX / Arm BF16; None: unknown."""
    if backend == "tpu":
        return True
    if backend == "gpu":
        capability = getattr(device, "compute_capability", None)
        try:
            return float(capability) >= 8.0
        except (TypeError, ValueError):
            return None
    return cpu_has_bf16


def run_header(
    *,
    backend: str,
    device_kind: str,
    process_index: int,
    process_count: int,
    global_devices: int,
    local_devices: int,
    mesh_shape: Mapping[str, int],
    dtype: str,
    native: bool | None,
    memory: dict[str, int] | None,
    host_memory_bytes: int | None,
) -> list[str]:
    """The run's first log lines (see the module docstring)."""
    mesh = " x ".join(f"{name}={size}" for name, size in mesh_shape.items())
    if dtype == "float32":
        compute = "float32"
    else:
        how = {True: "native on this hardware", False: "emulated: no native bf16 here",
               None: "native support unknown"}[native]  # fmt: skip
        compute = f"{dtype} ({how})"
    if memory is not None:
        each = f"{memory['device_limit_bytes'] / GiB:.1f} GiB a device"
    elif host_memory_bytes:
        each = f"host memory {host_memory_bytes / GiB:.1f} GiB, shared by the local devices"
    else:
        each = "unknown"
    return [
        f"platform: {backend} ({device_kind}), process {process_index} of {process_count}, "
        f"{global_devices} devices ({local_devices} local)",
        f"mesh: {mesh}; compute: {compute}; memory: {each}",
    ]
