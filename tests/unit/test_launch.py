"""Launching under schedulers: the devices each SLURM task asks JAX for, the layout warning,
the run's first lines, one log per run, and `train.profile_steps`' validation."""

import logging
import warnings

import pytest
from helpers import tiny_config
from jax._src import clusters

from tfm_jax.cli import log_setup
from tfm_jax.config.validate import ConfigError, validate
from tfm_jax.model import sharding
from tfm_jax.platform import cluster, report

GPUS8 = "0,1,2,3,4,5,6,7"


def slurm_env(tasks_per_node, nodes=4, localid=0, cuda=GPUS8, **extra):
    """A task's environment inside `srun`, as SLURM 22 sets it (names and formats)."""
    ntasks = tasks_per_node * nodes
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": f"gpu[001-00{nodes}]",
        "SLURM_STEP_NODELIST": f"gpu[001-00{nodes}]",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
        "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
        "SLURM_PROCID": str(localid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": "0",
        "SLURM_GPUS_ON_NODE": "8",
    }
    if cuda is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda
    env.update(extra)
    return env


def test_one_task_per_node_asks_jax_for_all_of_the_nodes_gpus(monkeypatch):
    env = slurm_env(tasks_per_node=1)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got = {}
    monkeypatch.setattr(sharding.jax.distributed, "initialize", lambda **kw: got.update(kw))
    monkeypatch.setattr(sharding.jax, "process_index", lambda: 0)
    assert cluster.maybe_initialize_distributed() == 0
    assert got == {"local_device_ids": list(range(8))}
    # What JAX then makes of it: SLURM's coordinator, count and id, and our 8 devices. Without
    # them it would have restricted the process to GPU SLURM_LOCALID alone (the bug).
    detect = clusters.ClusterEnv.auto_detect_unset_distributed_params
    addr, n, pid, ids = detect(None, None, None, got["local_device_ids"], None, 300)
    assert (n, pid, ids) == (4, 0, list(range(8))) and addr.startswith("gpu001:")
    assert detect(None, None, None, None, None, 300)[3] == [0]


@pytest.mark.parametrize(
    "tasks, localid, cuda, expected",
    [
        (1, 0, GPUS8, list(range(8))),  # one process per node owns the node
        (8, 5, GPUS8, [5]),  # one per GPU, all visible: the local rank's
        (8, 5, "5", [0]),  # one per GPU, SLURM bound it (--gpus-per-task=1): the one it sees
        (2, 1, GPUS8, [4, 5, 6, 7]),  # two per node: the local rank's half
        (4, 0, None, None),  # no GPU visible (a CPU node): nothing restricted
    ],
)
def test_slurm_local_device_ids(tasks, localid, cuda, expected, monkeypatch):
    monkeypatch.setattr(cluster, "node_gpu_count", lambda: 0)
    task = cluster.slurm_task(slurm_env(tasks, localid=localid, cuda=cuda))
    assert task.tasks_on_node == tasks and task.local_rank == localid
    assert cluster.local_device_ids(task) == expected


def test_slurm_layouts_that_cannot_work_or_are_not_a_step():
    with pytest.raises(cluster.LayoutError, match="cannot split"):
        cluster.local_device_ids(cluster.slurm_task(slurm_env(3, nodes=1)))
    batch_shell = slurm_env(1)
    del batch_shell["SLURM_STEP_NODELIST"]  # python run in the batch script, not under srun
    assert cluster.slurm_task(batch_shell) is None
    assert cluster.distributed_kwargs(batch_shell) is None
    assert cluster.distributed_kwargs(slurm_env(1, nodes=1)) is None  # one task: no init
    assert cluster.distributed_kwargs(slurm_env(1, JAX_LOCAL_DEVICE_IDS="0,1")) == {}  # JAX's
    assert cluster.distributed_kwargs({"TPU_WORKER_HOSTNAMES": "t0,t1"}) == {}
    assert cluster.distributed_kwargs({"TFM_JAX_DISTRIBUTED": "1"}) == {}
    assert cluster.distributed_kwargs({}) is None
    assert cluster._tasks_on_node("2(x3),1", 3) == 1 and cluster._tasks_on_node("8", 0) == 8


def test_layout_warning_counts_idle_accelerators():
    msg = cluster.layout_warning("gpu", local_devices=1, tasks_on_node=1, node_devices=8)
    assert "uses 1 of the node's 8 GPUs" in msg and "7 idle" in msg and "--ntasks-per-node=1" in msg
    assert cluster.layout_warning("gpu", 8, 1, 8) is None
    assert cluster.layout_warning("gpu", 1, 8, 8) is None  # one process per GPU
    assert cluster.layout_warning("cpu", 1, 2, 0) is None
    env = slurm_env(1, nodes=2, CUDA_VISIBLE_DEVICES="0")
    assert cluster.node_layout(env) == (1, 8)  # the job has 8 GPUs on the node, 1 visible


class FakeDevice:
    def __init__(self, stats, capability=None):
        self._stats, self.compute_capability = stats, capability

    def memory_stats(self):
        return self._stats


def test_run_header_and_device_memory():
    gib = 2**30
    devices = [FakeDevice({"bytes_in_use": 3 * gib, "peak_bytes_in_use": 5 * gib,
                           "bytes_limit": 100 * gib}),
               FakeDevice({"bytes_in_use": 4 * gib, "peak_bytes_in_use": 4 * gib,
                           "bytes_limit": 99 * gib})]  # fmt: skip
    memory = report.device_memory(devices)
    assert memory == {"device_bytes": 4 * gib, "device_peak_bytes": 5 * gib,
                      "device_limit_bytes": 99 * gib}  # fmt: skip
    assert report.device_memory([FakeDevice(None)]) is None  # CPU devices keep no statistics
    assert report.bf16_native("gpu", FakeDevice(None, "9.0"), None) is True
    assert report.bf16_native("gpu", FakeDevice(None, "7.5"), None) is False  # T4
    assert report.bf16_native("cpu", FakeDevice(None), False) is False
    lines = report.run_header(
        backend="gpu", device_kind="NVIDIA H200", process_index=0, process_count=4,
        global_devices=32, local_devices=8, mesh_shape={"data": 16, "model": 2},
        dtype="bfloat16", native=True, memory=memory, host_memory_bytes=None,
    )  # fmt: skip
    assert lines == [
        "platform: gpu (NVIDIA H200), process 0 of 4, 32 devices (8 local)",
        "mesh: data=16 x model=2; compute: bfloat16 (native on this hardware); "
        "memory: 99.0 GiB a device",
    ]


@pytest.fixture
def root_handler():
    log_setup.setup_logging()
    handler = next(h for h in logging.getLogger().handlers
                   if isinstance(h, log_setup._StderrHandler))  # fmt: skip
    yield handler
    for f in list(handler.filters):
        handler.removeFilter(f)
    logging.captureWarnings(False)


def test_processes_other_than_0_log_only_errors(root_handler, capsys):
    log = logging.getLogger("tfm_jax.test")
    log_setup.only_errors_unless_primary(0)
    log.warning("from process 0")
    assert "from process 0" in capsys.readouterr().err
    log_setup.only_errors_unless_primary(1)
    log.info("progress")
    log.warning("a warning")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a python warning", UserWarning, stacklevel=1)
    log.error("this process's own error")
    err = capsys.readouterr().err
    assert "progress" not in err and "a warning" not in err and "python warning" not in err
    assert "this process's own error" in err


@pytest.mark.parametrize("steps", [(5,), (0, 3), (4, 2), (1.5, 2)])
def test_profile_steps_must_be_a_range(steps):
    with pytest.raises(ConfigError, match="train.profile_steps.*10,15"):
        tiny_config(**{"train.profile_steps": steps})  # validated as it is built
    validate(tiny_config(**{"train.profile_steps": (3, 3)}))
