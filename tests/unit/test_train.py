"""The sharded train step: 8 simulated devices == 1 device, no recompiles, a tiny model learns;
and what the loop reports (reporting.py)."""

import errno
import types

import jax
import numpy as np
import pytest

from tfm_jax.model import sharding
from tfm_jax.train.reporting import MetricsWriter
from tfm_jax.train.trainer import make_trainer


def fixed_batch():
    rng = np.random.default_rng(0)
    src = rng.integers(4, 64, size=(8, 10)).astype(np.int32)
    tgt = rng.integers(4, 64, size=(8, 9)).astype(np.int32)
    src[:, -2:] = 0
    tgt[:, -1] = 1  # EOS
    tgt[::2, -3:] = 0
    return {"inputs": src, "targets": tgt}


def test_second_call_does_not_recompile(tiny_cfg):
    trainer = make_trainer(tiny_cfg)
    state = trainer.init_state(0)
    batch = sharding.global_batch(fixed_batch(), trainer.mesh)
    state, _ = trainer.train_step(state, batch)
    state, _ = trainer.train_step(state, sharding.global_batch(fixed_batch(), trainer.mesh))
    assert trainer.train_step_fn._cache_size() == 1
    assert int(state.step) == 2


def test_tiny_model_overfits_one_batch():
    from helpers import tiny_config

    cfg = tiny_config(**{
        "model.dropout": 0.0, "loss.label_smoothing": 0.0, "optim.warmup_steps": 30,
        "optim.lr_factor": 1.0,
    })  # fmt: skip
    trainer = make_trainer(cfg)
    state = trainer.init_state(0)
    batch = sharding.global_batch(fixed_batch(), trainer.mesh)
    losses = []
    for _ in range(60):
        state, m = trainer.train_step(state, batch)
        losses.append(float(m["loss"]) / float(m["tokens"]))
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])


def test_eval_step_matches_loss_sums(tiny_cfg):
    trainer = make_trainer(tiny_cfg)
    state = trainer.init_state(0)
    batch = fixed_batch()
    sums = trainer.eval_step(state.params, sharding.global_batch(batch, trainer.mesh))
    assert float(sums["tokens"]) == float(np.sum(batch["targets"] != 0))
    assert float(sums["nll"]) / float(sums["tokens"]) == pytest.approx(np.log(64), rel=0.2)


def test_diverged_params_give_a_nan_loss_metric(tiny_cfg):
    """What the loop's NaN stop reads: a state gone non-finite shows in metrics["loss"]."""
    trainer = make_trainer(tiny_cfg)
    state = trainer.init_state(0)
    batch = sharding.global_batch(fixed_batch(), trainer.mesh)
    state, m0 = trainer.train_step(state, batch)
    assert np.isfinite(float(m0["loss"]))
    state = state.replace(params=jax.tree.map(lambda p: p * np.nan, state.params))
    state, m1 = trainer.train_step(state, batch)
    assert np.isnan(float(m1["loss"])) and np.isnan(float(m1["grad_norm"]))
    assert float(m1["tokens"]) == float(m0["tokens"])  # the token count is not poisoned


def test_trainer_schedule_is_the_learning_rate_applied(tiny_cfg):
    """Trainer.schedule (what the loop logs as lr) is the one inside the optimizer: Adam's
    first update moves each weight with a non-negligible gradient by lr = schedule(0)."""
    cfg = tiny_cfg
    cfg.model.dropout = 0.0
    trainer = make_trainer(cfg)
    state = trainer.init_state(0)
    before = jax.device_get(state.params)
    state, _ = trainer.train_step(state, sharding.global_batch(fixed_batch(), trainer.mesh))
    step = max(float(np.max(np.abs(a - b)))
               for a, b in zip(jax.tree.leaves(jax.device_get(state.params)),
                               jax.tree.leaves(before), strict=True))  # fmt: skip
    lr = float(trainer.schedule(0))
    assert lr == pytest.approx(cfg.optim.d_model**-0.5 * cfg.optim.warmup_steps**-1.5, rel=1e-6)
    assert step == pytest.approx(lr, rel=1e-3)


def test_a_failed_metrics_write_is_kept_for_the_loop_not_raised(tmp_path):
    """With several hosts only the lead writes; its failure must wait for the point where every
    host asks (loop.stop_on_a_failed_write), counted by `writes` alike on every host."""
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    lead, other = MetricsWriter(str(tmp_path), enabled=True), MetricsWriter("x", enabled=False)
    for w in (lead, other):
        w.write(2, "train", {"loss": 1.0})
        w.write(4, "train", {"loss": 0.5})
    assert lead.writes == other.writes == 2
    assert lead.failed.errno == errno.ENOSPC
    assert lead.failed.filename == str(tmp_path / "metrics.jsonl")
    assert other.failed is None
    lead.close()  # no raise: the loop says it


def test_nothing_is_written_after_a_failed_metrics_write(tmp_path):
    """Once metrics.jsonl failed, TensorBoard's event files (same disk) get nothing either."""
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    lead = MetricsWriter(str(tmp_path), enabled=True)
    scalars = []
    lead._tb = types.SimpleNamespace(  # a recorder in TensorBoard's place
        add_scalar=lambda tag, v, step: scalars.append((tag, step)),
        flush=lambda: None, close=lambda: None,
    )  # fmt: skip
    lead.write(2, "train", {"loss": 1.0})  # fails; its own scalar is already on its way
    lead.write(4, "train", {"loss": 0.5})
    lead.close()
    assert lead.failed.errno == errno.ENOSPC
    assert scalars == [("train/loss", 2)]
    assert lead.writes == 2 and lead._pending == []
