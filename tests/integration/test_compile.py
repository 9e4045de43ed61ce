"""`python -m tfm_jax compile`: the real programs compiled for a TPU slice and a GPU node on this
CPU host, as a user runs it (the CLI in a new process). Needs the compile extras (`.[tpu]`,
`.[cuda12-compile]`, which CI installs); each test skips, saying so, where its extra is missing."""

import importlib.util
import json
import subprocess
import sys

import pytest
from helpers import REPO, process_env

HAS_TPU = importlib.util.find_spec("libtpu") is not None
# (find_spec of a dotted name raises when the parent package is missing: check it first)
HAS_CUDA = (
    importlib.util.find_spec("jax_plugins") is not None
    and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
)
needs_tpu = pytest.mark.skipif(not HAS_TPU, reason="libtpu not installed: pip install -e '.[tpu]'")
needs_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="the CUDA plugin is not installed: pip install -e '.[cuda12-compile]'"
)
pytestmark = [pytest.mark.compile, pytest.mark.multiprocess]

# a small model: compiles in seconds a program on 2 cores
TINY = [
    "--config.model.num_layers=1",
    "--config.model.d_model=64",
    "--config.model.d_ff=128",
    "--config.model.num_heads=2",
    "--config.model.d_k=32",
    "--config.model.d_v=32",
    "--config.model.vocab_size=512",
    "--config.data.max_len=32",
    "--config.model.max_len=64",
    "--config.data.num_buckets=2",
    "--config.data.tokens_per_batch=1024",
    "--config.model.dtype=bfloat16",
    "--config.model.scan_layers=true",
    "--config.data.packing=false",
]


def run_compile(target: str, *extra: str, json_out: bool = True):
    cmd = [sys.executable, "-m", "tfm_jax", "compile", "--config=configs/small.py"]
    cmd += [f"--target={target}", *TINY, *extra] + (["--json"] if json_out else [])
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=process_env())  # fmt: skip


def check_record(r: dict, platform: str, devices: int, flops_source: str):
    assert r["platform"] == platform and r["devices"] == devices and r["fits"]
    assert r["mesh"] == {"data": devices, "model": 1}
    names = [p["name"] for p in r["programs"]]
    assert names.count("train_step") == 2 and names.count("eval_step") == 2  # 2 buckets each
    for p in r["programs"]:
        assert p["peak_bytes"] > 0 and p["compile_s"] > 0
        assert p["flops_per_chip"] > 0 and p["flops_source"] == flops_source
        assert p["shape"][0] % devices == 0  # rows split over the data axis
        if p["name"] == "train_step":
            assert p["temp_bytes"] > 0  # activations kept for the backward pass
            assert p["collectives"].get("all-reduce", 0) >= 1  # the gradients, data-parallel
            # XLA's count includes softmax, LayerNorm and Adam: at least the analytic matmuls
            assert p["flops_per_chip"] >= 0.95 * p["model_flops_per_chip"]
            assert 0 < p["mfu_estimate"] <= 1.0
    assert r["compile_s_total"] == pytest.approx(
        sum(p["lower_s"] + p["compile_s"] for p in r["programs"])
    )


@needs_tpu
def test_compile_for_a_tpu_slice_reports_each_chips_memory_and_flops():
    out = run_compile("v5e-4", "--config.model.scan_layers=false")  # XLA counts unrolled layers
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    check_record(r, "tpu", 4, "xla")
    assert r["device_kind"] == "TPU v5 lite" and r["memory_budget_bytes"] == 16 * 2**30
    assert all(p["bytes_accessed_per_chip"] for p in r["programs"])  # TPU's cost analysis


@needs_cuda
def test_compile_for_a_gpu_node_counts_flops_where_xla_does_not():
    from tfm_jax.cli import fit

    out = run_compile("h100x8")
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    check_record(r, "gpu", 8, "analytic")  # XLA:GPU gives no cost analysis
    table = fit.format_table(r)  # what the command prints without --json
    assert "h100x8 (8 x NVIDIA H100 80GB HBM3)" in table and "fits: yes" in table
    assert "* analytic matmul FLOPs" in table and "a lower bound" in table


@needs_tpu
def test_a_config_that_does_not_fit_a_tpu_is_one_line():
    # a 32k vocabulary's logits over 250k tokens a chip: ~60 GiB of temporaries on a 16 GiB chip;
    # one length bucket: 2 programs to compile, not 4 (a v5e-4's 24 s -> 8 s on 2 cores)
    big_logits = ["--config.model.vocab_size=32000", "--config.data.tokens_per_batch=1000000",
                  "--config.data.num_buckets=1"]  # fmt: skip
    out = run_compile("v5e-4", *big_logits, json_out=False)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("does not fit: train_step [") and "GiB over" in last, last


@needs_cuda
def test_a_config_that_does_not_fit_a_gpu_is_one_line():
    # 1M tokens a GPU of a 32k vocabulary's logits, against the 75% of 80 GB JAX preallocates;
    # one length bucket: 2 programs to compile, not 4 (an h100x8's 39 s -> 24 s on 2 cores)
    big_logits = ["--config.model.vocab_size=32000", "--config.data.tokens_per_batch=8000000",
                  "--config.data.num_buckets=1"]  # fmt: skip
    out = run_compile("h100x8", *big_logits, json_out=False)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("does not fit: train_step [") and "GiB over" in last, last


def test_an_unknown_target_is_a_config_error():
    out = run_compile("v7-8", json_out=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("config error: --target='v7-8'")


@needs_tpu
def test_the_mesh_over_a_tpu_topology_follows_its_torus(monkeypatch):
    """A 4x4 v5e slice: the data axis runs through the chips in torus order (mesh_utils'), not
    in the topology's device-id order."""
    from jax.experimental import mesh_utils

    from tfm_jax.model import sharding
    from tfm_jax.platform import targets

    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    devices = targets.parse_target("v5e-16").devices()
    mesh = sharding.make_mesh(-1, 1, devices)
    expected = mesh_utils.create_device_mesh((16, 1), devices=devices)
    assert [d.id for d in mesh.devices.flat] == [d.id for d in expected.flat]
    mesh2 = sharding.make_mesh(4, 4, devices)
    assert mesh2.shape == {"data": 4, "model": 4}
