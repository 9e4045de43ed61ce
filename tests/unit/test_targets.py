"""Compile targets (platform/targets.py), the seam resolved for a target that is not the host,
the worst-case batch shapes a config gives without its data, and the collectives count."""

import flax.linen as nn
import jax
import pytest
from helpers import tiny_config

from tfm_jax import platform
from tfm_jax.data import plans
from tfm_jax.model import flops, scoring
from tfm_jax.platform import targets
from tfm_jax.train import aot


@pytest.mark.parametrize(
    "name, chip, chips, slices, platform_name, torus",
    [
        ("v5e-16", "v5e", 16, 1, "tpu", "v5e:4x4"),
        ("v5e-8", "v5e", 8, 1, "tpu", "v5e:2x4"),
        ("v6e-256", "v6e", 256, 1, "tpu", "v6e:16x16"),
        ("v4-8", "v4", 4, 1, "tpu", "v4:2x2x1"),  # v4 counts TensorCores: 2 a chip
        ("v4-16", "v4", 8, 1, "tpu", "v4:2x2x2"),
        ("v5p-64", "v5p", 32, 1, "tpu", "v5p:2x4x4"),
        ("2xv5e-16", "v5e", 16, 2, "tpu", "v5e:4x4"),
        ("h200x8", "h200", 8, 1, "gpu", None),
        ("4xH100x8", "h100", 8, 4, "gpu", None),
    ],
)
def test_target_names_parse_as_users_name_hardware(name, chip, chips, slices, platform_name, torus):
    t = targets.parse_target(name)
    assert (t.chip_name, t.chips, t.slices, t.platform) == (chip, chips, slices, platform_name)
    assert t.num_devices == chips * slices
    if torus:
        assert t.tpu_topology()[0] == torus


@pytest.mark.parametrize("bad", ["v5e", "v9-8", "h100", "v5e-12", "v4-7", "tpu"])
def test_unknown_targets_say_what_is_known(bad):
    with pytest.raises(targets.TargetError, match="v5e|power|cores"):
        targets.parse_target(bad)


def test_gpu_budget_is_the_share_jax_preallocates(monkeypatch):
    t = targets.parse_target("h200x8")
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert t.memory_budget() == int(t.chip.hbm_bytes * 0.75)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    assert t.memory_budget() == int(t.chip.hbm_bytes * 0.9)
    assert targets.parse_target("v5e-16").memory_budget() == 16 * 2**30  # all of a TPU's HBM


def test_the_seam_resolves_auto_for_the_target_not_the_host(monkeypatch):
    assert platform.backend() == "cpu"
    assert platform.dropout_prng("auto") == "threefry_fused"  # this host
    assert platform.dropout_prng("auto", "tpu") == "threefry"
    assert platform.dropout_prng("auto", "gpu") == "threefry"
    assert platform.resolve_product("auto") == "cpu_canonical"
    assert platform.resolve_product("auto", "tpu") == platform.resolve_product("auto", "gpu")
    assert platform.resolve_product("auto", "gpu") == "einsum"
    cfg = tiny_config(**{"platform.compilation_cache": ""})
    runtime = platform.init_runtime(cfg, target="tpu")
    assert runtime.backend == "tpu" and runtime.product == "einsum"
    # the model carries its product, resolved for the program's platform
    assert scoring.make_model(cfg, "tpu").product == "einsum"
    assert scoring.make_model(cfg).product == "cpu_canonical"
    platform.init_runtime(cfg)  # this host again


def test_a_model_computes_the_same_whatever_ran_before_it():
    """No process-wide setting decides the numerics: a bf16 model traced before and after
    init_runtime for another target gives the same program, and models made for different
    targets differ only by the product they carry."""
    cfg = tiny_config(**{"platform.compilation_cache": "", "model.dtype": "bfloat16"})
    model = scoring.make_model(cfg)
    inputs, targets = scoring.dummy_batch()
    boxed = jax.eval_shape(lambda r: scoring.boxed_params(model, r), jax.random.PRNGKey(0))
    params = nn.unbox(boxed)

    def program(m):
        return str(jax.make_jaxpr(lambda p: m.apply({"params": p}, inputs, targets))(params))

    before = program(model)
    platform.init_runtime(cfg, target="tpu")
    try:
        assert program(model) == before
        tpu = program(scoring.make_model(cfg, "tpu"))
        assert tpu != before and "dot_general" in tpu  # the plain einsum, not the CPU layout
    finally:
        platform.init_runtime(cfg)


class _Device:
    def __init__(self, name):
        self.platform = name


def test_platform_of_devices():
    assert platform.platform_of([_Device("tpu")] * 4) == "tpu"
    assert platform.platform_of([_Device("cuda")]) == "gpu"
    with pytest.raises(ValueError, match="several platforms"):
        platform.platform_of([_Device("tpu"), _Device("cpu")])


def test_config_shapes_are_the_worst_case_buckets_or_the_packed_row():
    cfg = tiny_config(**{"data.max_len": 64, "data.num_buckets": 4, "data.tokens_per_batch": 1024})
    shapes = plans.config_shapes(cfg.data, unit=8, packing=False)
    assert [s[1] for s in shapes] == [16, 32, 48, 64] and all(s[1] == s[2] for s in shapes)
    for rows, s, t in shapes:
        assert rows % 8 == 0 and rows * max(s, t) <= 1024  # within the budget, a multiple of dp
    cfg.data.tokens_per_batch = 4096
    assert plans.config_shapes(cfg.data, unit=8, packing=True) == [(16, 256, 256)]
    cfg.data.packed_length = 100  # rounded up to data.length_multiple 8
    assert plans.config_shapes(cfg.data, unit=2, packing=True) == [(38, 104, 104)]


def test_collectives_are_counted_once_per_async_pair():
    hlo = (
        "  %a = f32[8] all-reduce-start(f32[8] %x), replica_groups={}\n"
        "  %b = f32[8] all-reduce-done(f32[8] %a)\n"
        "  %c = f32[64] all-gather(f32[8] %y), dimensions={0}\n"
        "  %d = f32[8] all-reduce(f32[8] %z)\n"
    )
    assert aot.count_collectives(hlo) == {"all-reduce": 2, "all-gather": 1}


def test_forward_flops_are_a_third_of_a_train_step():
    cfg = tiny_config()
    train = flops.matmul_flops(cfg.model, 4, 16, 16)
    assert train > 0 and flops.forward_flops(cfg.model, 4, 16, 16) == pytest.approx(train / 3)


class _Cost:
    def __init__(self, flops):
        self.flops = flops

    def cost_analysis(self):
        return None if self.flops is None else [{"flops": self.flops}]


def test_xla_flops_are_the_whole_program_s_else_the_compiled_per_device_count():
    from tfm_jax.train import trainer

    # whole-program count (lowered) first; the compiled one is per device
    assert trainer.xla_flops(_Cost(120.0), _Cost(1.0), 8) == 120.0
    assert trainer.xla_flops(_Cost(None), _Cost(15.0), 8) == 120.0
    assert trainer.xla_flops(_Cost(None), _Cost(None), 8) == 0.0
    assert trainer.xla_flops(_Cost(0.0), _Cost(0.0), 8) == 0.0
