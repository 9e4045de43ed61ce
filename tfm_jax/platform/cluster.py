"""How this process sits in a multi-host job: the arguments for `jax.distributed.initialize`,
and the check that a process uses every accelerator its node was given.

Left to itself, `jax.distributed.initialize()` under SLURM restricts each process to one GPU,
the one numbered SLURM_LOCALID (jax/_src/clusters/cluster.py), which is right only for one task
per GPU. With the usual one task per node owning its 8 GPUs, 4 nodes would train on 4 GPUs,
silently. So under SLURM the local devices are decided here, from what the job asked for:

- one task on the node: every GPU the process can see (CUDA_VISIBLE_DEVICES, which SLURM sets
  to the job's GPUs on the node);
- one task per GPU, with all the node's GPUs visible to each (`--gpus-per-node=8
  --ntasks-per-node=8`): the GPU numbered by the task's local rank;
- one GPU visible to the task (SLURM bound it, `--gpus-per-task=1` or `--gpu-bind`): that GPU;
- k GPUs a task otherwise (T tasks sharing T*k visible GPUs): the local rank's contiguous k.

No GPU visible (CPU nodes; TPU VMs, where JAX never restricts): nothing is restricted. A
JAX_LOCAL_DEVICE_IDS in the environment wins over all of this, as in JAX.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from collections.abc import Mapping


class LayoutError(ValueError):
    """The job's tasks and GPUs cannot be matched up; the message says how to launch instead."""


@dataclasses.dataclass(frozen=True)
class SlurmTask:
    """The SLURM facts about this process that decide its devices."""

    process_id: int
    num_processes: int
    local_rank: int
    tasks_on_node: int
    visible_gpus: int  # GPUs this process can see (CUDA_VISIBLE_DEVICES, else the node's)
    node_gpus: int  # GPUs the job has on this node (SLURM_GPUS_ON_NODE, else visible)


def _tasks_on_node(spec: str, node_index: int) -> int:
    """SLURM's compressed tasks-per-node list ("2(x3),1") at one node's index."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise LayoutError(f"cannot read SLURM's tasks per node {spec!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[min(node_index, len(counts) - 1)]


def node_gpu_count() -> int:
    """NVIDIA GPUs the kernel driver lists on this machine (0 without the driver)."""
    found = glob.glob("/proc/driver/nvidia/gpus/*")
    return len(found) or len(glob.glob("/dev/nvidia[0-9]*"))


def _visible_gpus(environ: Mapping[str, str]) -> int:
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    return node_gpu_count()


def slurm_task(environ: Mapping[str, str] | None = None) -> SlurmTask | None:
    """This process's place in a SLURM job step with several tasks; None outside one."""
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env or "SLURM_PROCID" not in env:
        return None
    num = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
    if num <= 1 or "SLURM_STEP_NODELIST" not in env:
        return None  # one task, or the batch shell itself (not an srun step)
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1"
    tasks = _tasks_on_node(spec, int(env.get("SLURM_NODEID", 0)))
    visible = _visible_gpus(env)
    node = int(env["SLURM_GPUS_ON_NODE"]) if env.get("SLURM_GPUS_ON_NODE") else visible
    return SlurmTask(
        process_id=int(env["SLURM_PROCID"]),
        num_processes=num,
        local_rank=int(env.get("SLURM_LOCALID", 0)),
        tasks_on_node=tasks,
        visible_gpus=visible,
        node_gpus=node,
    )


def local_device_ids(task: SlurmTask) -> list[int] | None:
    """The GPUs (numbered as this process sees them) it should use; None: do not restrict."""
    n, tasks, rank = task.visible_gpus, task.tasks_on_node, task.local_rank
    if n == 0:
        return None
    if tasks == 1:
        return list(range(n))
    if n == 1:
        return [0]
    if n == tasks:
        return [rank]
    if n % tasks == 0:
        k = n // tasks
        return list(range(rank * k, (rank + 1) * k))
    raise LayoutError(
        f"{tasks} SLURM tasks on this node share {n} visible GPUs, which they cannot split "
        "evenly: launch one task per node (--ntasks-per-node=1, the template's default) or one "
        "per GPU (--ntasks-per-node equal to --gpus-per-node)"
    )


def distributed_kwargs(environ: Mapping[str, str] | None = None) -> dict | None:
    """Keyword arguments for `jax.distributed.initialize` in a scheduler-launched job (SLURM,
    Open MPI, a TPU pod, or TFM_JAX_DISTRIBUTED=1); None when this is a single-process run.

    JAX detects the coordinator, process count and id itself; only the local devices are
    decided here (see the module docstring), and only under SLURM. On TPU VMs started with
    `gcloud ... ssh --worker=all` nothing in the environment says "pod": set
    TFM_JAX_DISTRIBUTED=1 there (configs/launch/tpu_vm.sh does).
    """
    env = os.environ if environ is None else environ
    task = slurm_task(env)
    if task is not None:
        if env.get("JAX_LOCAL_DEVICE_IDS"):
            return {}  # the user's choice, read by JAX
        ids = local_device_ids(task)
        return {} if ids is None else {"local_device_ids": ids}
    if (
        env.get("TFM_JAX_DISTRIBUTED") == "1"
        or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
        or "," in env.get("TPU_WORKER_HOSTNAMES", "")  # a multi-host TPU slice on GKE
    ):
        return {}
    return None


def layout_warning(
    backend: str, local_devices: int, tasks_on_node: int, node_devices: int
) -> str | None:
    """A warning when this node's processes together use fewer accelerators than it has."""
    if backend == "cpu" or node_devices <= 0:
        return None
    used = local_devices * tasks_on_node
    if used >= node_devices:
        return None
    return (
        f"this process uses {local_devices} of the node's {node_devices} {backend.upper()}s "
        f"({tasks_on_node} process{'es' if tasks_on_node > 1 else ''} on the node: "
        f"{node_devices - used} idle). Launch one process per node owning all its devices "
        "(srun --ntasks-per-node=1, as configs/launch/slurm.sbatch does) or one per device, "
        "and check CUDA_VISIBLE_DEVICES / JAX_LOCAL_DEVICE_IDS"
    )


def node_layout(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(processes on this node, accelerators the node has for this job), for layout_warning."""
    env = os.environ if environ is None else environ
    task = slurm_task(env)
    if task is not None:
        return task.tasks_on_node, task.node_gpus
    return 1, _visible_gpus(env)  # a deliberate CUDA_VISIBLE_DEVICES is not a mistake


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
    import jax

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
        kwargs = distributed_kwargs()
        if kwargs is None:
            return 0
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU-only SLURM jobs
        jax.distributed.initialize(**kwargs)
    return jax.process_index()  # the run's first lines (platform.describe) say the rest
