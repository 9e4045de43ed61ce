"""The sharded train step: 8 simulated devices == 1 device, no recompiles, a tiny model learns."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfm_jax.train import sharding
from tfm_jax.train import trainer as train

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_eight_devices_match_one_device():
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "sharded_step_check.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(results) == {"model1", "model2", "bf16_model2", "scan_model2"}
    for name, r in results.items():  # data-parallel 8x1 and data x model 4x2 (f32 and bf16)
        assert r["cache_size"] == 1, f"{name}: the step compiled {r['cache_size']} times"
        if name.startswith("bf16"):  # bf16 rounding of differently ordered f32 sums
            np.testing.assert_allclose(r["loss_8"], r["loss_1"], rtol=1e-2, err_msg=name)
            continue
        np.testing.assert_allclose(r["loss_8"], r["loss_1"], rtol=1e-5, err_msg=name)
        assert r["param_allclose_excess"] <= 0, (name, r)  # params allclose(rtol=1e-5, atol=1e-5)


def fixed_batch():
    rng = np.random.default_rng(0)
    src = rng.integers(4, 64, size=(8, 10)).astype(np.int32)
    tgt = rng.integers(4, 64, size=(8, 9)).astype(np.int32)
    src[:, -2:] = 0
    tgt[:, -1] = 1  # EOS
    tgt[::2, -3:] = 0
    return {"inputs": src, "targets": tgt}


def test_second_call_does_not_recompile(tiny_cfg):
    trainer = train.make_trainer(tiny_cfg)
    state = trainer.init_state(0)
    batch = sharding.global_batch(fixed_batch(), trainer.mesh)
    state, _ = trainer.train_step(state, batch)
    state, _ = trainer.train_step(state, sharding.global_batch(fixed_batch(), trainer.mesh))
    assert trainer.train_step_fn._cache_size() == 1
    assert int(state.step) == 2


def test_tiny_model_overfits_one_batch():
    from conftest import tiny_config

    cfg = tiny_config(**{
        "model.dropout": 0.0, "loss.label_smoothing": 0.0, "optim.warmup_steps": 30,
        "optim.lr_factor": 1.0,
    })  # fmt: skip
    trainer = train.make_trainer(cfg)
    state = trainer.init_state(0)
    batch = sharding.global_batch(fixed_batch(), trainer.mesh)
    losses = []
    for _ in range(60):
        state, m = trainer.train_step(state, batch)
        losses.append(float(m["loss"]) / float(m["tokens"]))
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])


def test_eval_step_matches_loss_sums(tiny_cfg):
    trainer = train.make_trainer(tiny_cfg)
    state = trainer.init_state(0)
    batch = fixed_batch()
    sums = trainer.eval_step(state.params, sharding.global_batch(batch, trainer.mesh))
    assert float(sums["tokens"]) == float(np.sum(batch["targets"] != 0))
    assert float(sums["nll"]) / float(sums["tokens"]) == pytest.approx(np.log(64), rel=0.2)


def test_nan_hook_makes_loss_nan():
    from conftest import tiny_config

    trainer = train.make_trainer(tiny_config(**{"train.nan_at_step": 1}))
    state = trainer.init_state(0)
    batch = sharding.global_batch(fixed_batch(), trainer.mesh)
    state, m0 = trainer.train_step(state, batch)
    state, m1 = trainer.train_step(state, batch)
    assert np.isfinite(float(m0["loss"])) and np.isnan(float(m1["loss"]))
