"""Device mesh, logical-axis rules and multi-host setup.

Params and activations name logical axes ("batch", "heads", "mlp", ...); `cfg.mesh.rules` maps
them onto the mesh axes ("data", "model"). One jitted program then runs on 1 CPU, 8 simulated
devices, a GPU box or a TPU pod slice: only the mesh changes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tfm_jax import platform
from tfm_jax.platform import cluster

log = logging.getLogger(__name__)

MESH_AXES = ("data", "model")


def maybe_initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> int:
    """Joins a multi-host run when one is configured (a no-op on a single host); returns this
    process's index.

    Explicit arguments (e.g. a 2-process run on localhost) win; otherwise SLURM, Open MPI and
    multi-host TPU environments are detected (platform/cluster.py decides the local devices
    under SLURM, where JAX alone would give each process one GPU), and JAX finds the rest. Set
    TFM_JAX_DISTRIBUTED=1 to force auto-detection where no such variable is visible.
    """
    if coordinator_address:
        # CPU collectives across processes need an implementation; gloo ships with jaxlib. It
        # only affects the CPU backend, and asking which backend is in use would initialize it
        # (which jax.distributed.initialize must precede).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
        )
    else:
        kwargs = cluster.distributed_kwargs()
        if kwargs is None:
            return 0
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU-only SLURM jobs
        jax.distributed.initialize(**kwargs)
    return jax.process_index()  # the run's first lines (platform.describe) say the rest


def make_mesh(data: int = -1, model: int = 1, devices: Sequence | None = None) -> Mesh:
    """A 2-D ("data", "model") mesh; -1 on data takes every device that `model` leaves."""
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if model < 1 or n % model:
        raise ValueError(
            f"mesh.model={model} must divide the {n} available devices (set --config.mesh.model)"
        )
    if data == -1:
        data = n // model
    if data * model != n:
        raise ValueError(
            f"mesh.data={data} x mesh.model={model} = {data * model} devices, but {n} are "
            "available: set mesh.data=-1 to use them all, or make the product match"
        )
    # A whole set of devices (this run's, or a compile-only topology's, whose platform is not
    # the host's) is laid out by its physical topology (TPU torus, GPU nodes); a CPU subset is
    # taken in order.
    if (
        jax.process_count() > 1
        or len(devices) == jax.device_count()
        or platform.platform_of(devices) != platform.backend()
    ):
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh((data, model), devices=devices)
    else:
        grid = np.asarray(devices).reshape(data, model)
    return Mesh(grid, MESH_AXES)


def logical_shardings(logical_specs, mesh: Mesh, rules):
    """Tree of logical PartitionSpecs (nn.get_partition_spec) -> tree of NamedShardings."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, tuple(tuple(r) for r in rules))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batch rows split over "data", replicated over "model"."""
    return NamedSharding(mesh, P("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Each process's rows -> one global array per key, sharded on the "data" axis.

    On one process this is a device_put; on several, each contributes its local rows
    (jax.make_array_from_process_local_data), so no host ever holds the whole batch.
    """
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
        for k, v in local_batch.items()
    }


@contextlib.contextmanager
def sharding_context(mesh: Mesh, rules):
    """The mesh and logical-axis rules that the model's `with_logical_constraint`s resolve in."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(tuple(tuple(r) for r in rules)):
        yield


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"]
