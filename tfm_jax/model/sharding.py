"""Device mesh and logical-axis rules (joining a multi-host run is platform/cluster.py's).

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

log = logging.getLogger(__name__)

MESH_AXES = ("data", "model")


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
