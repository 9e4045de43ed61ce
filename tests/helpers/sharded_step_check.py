"""Run as a subprocess with 8 simulated CPU devices: 1-device vs 8-device train steps.

`python -m helpers.sharded_step_check` from tests/, which sets its 8 devices (the suite's process
environment, helpers.process_env) before JAX is imported; tests/integration/test_processes.py
starts it with the same environment.
Prints one JSON line: max relative differences of loss and params, and the compile count.
"""

import json
import os

from helpers import process_env, tiny_config  # imports no JAX

os.environ.update(process_env(xla_flags="--xla_force_host_platform_device_count=8"))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tfm_jax import platform  # noqa: E402
from tfm_jax.checkpoint import room  # noqa: E402
from tfm_jax.model import scoring, sharding  # noqa: E402
from tfm_jax.train import trainer as train  # noqa: E402


def batch(seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(4, 64, size=(16, 12)).astype(np.int32)
    tgt = rng.integers(4, 64, size=(16, 10)).astype(np.int32)
    src[:, 9:] = 0
    src[::3, 6:] = 0
    tgt[:, 8:] = 0
    tgt[1::4, 5:] = 0
    return {"inputs": src, "targets": tgt}


def run(mesh, cfg, steps=3):
    trainer = train.make_trainer(cfg, mesh)
    state = trainer.init_state(0)
    losses = []
    for i in range(steps):
        state, metrics = trainer.train_step(state, sharding.global_batch(batch(i), mesh))
        losses.append(float(metrics["loss"]) / float(metrics["tokens"]))
    params = jax.tree.map(np.asarray, state.params)
    return losses, params, trainer, room.state_bytes(state)


def main():
    assert jax.device_count() == 8, jax.devices()
    # the compilation cache, as every command has it: the 1-device runs of model1 and model2
    # are one program, compiled once
    platform.init_runtime()
    results = {}
    for name, model_axis, dtype, scan in (
        ("model1", 1, "float32", False),
        ("model2", 2, "float32", False),
        ("bf16_model2", 2, "bfloat16", False),
        ("scan_model2", 2, "float32", True),  # params stacked on a "layers" axis
    ):
        cfg = tiny_config(**{"model.dropout": 0.1, "model.dtype": dtype,
                             "model.scan_layers": scan})  # fmt: skip
        one = sharding.make_mesh(1, 1, devices=jax.devices()[:1])
        eight = sharding.make_mesh(8 // model_axis, model_axis)
        l1, p1, _, bytes_1 = run(one, cfg)
        l8, p8, trainer, bytes_8 = run(eight, cfg)
        # elementwise np.allclose(p8, p1, rtol=1e-5, atol=1e-5): worst excess over the bound.
        # atol: Adam divides by sqrt(v) + 1e-9, so a weight whose gradient is ~0 moves by up to
        # lr either way when the sum order changes; each step moves weights by ~lr = 1e-2 here,
        # so a wrong gradient still fails by orders of magnitude.
        excess = max(
            float(np.max(np.abs(a - b) - (1e-5 + 1e-5 * np.abs(a))))
            for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8), strict=False)
        )
        # what inference restores into (no optimizer built) is what the run trains with
        _, inference = scoring.abstract_params(cfg, eight)
        same = jax.tree.map(
            lambda a, b: a.shape == b.shape and a.dtype == b.dtype and a.sharding == b.sharding,
            inference,
            trainer.abstract_state.params,
        )
        results[name] = {
            "abstract_params_match": all(jax.tree.leaves(same)),
            "loss_1": l1,
            "loss_8": l8,
            "param_allclose_excess": excess,
            "cache_size": trainer.train_step_fn._cache_size(),
            "state_bytes_1": bytes_1,  # what a checkpoint of it holds (room.py, its messages)
            "state_bytes_8": bytes_8,
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
