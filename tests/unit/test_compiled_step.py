"""Trainer.compile_train_step: the ahead-of-time compiled step the loop runs is the jitted step
(same numbers, bitwise), keeps its donation, and times lowering and compilation apart."""

import jax
import numpy as np

from tfm_jax.model import sharding
from tfm_jax.train.trainer import batch_flops, make_trainer


def fixed_batch(rows=4, length=8, vocab=64, seed=0):
    rng = np.random.default_rng(seed)
    ids = lambda: rng.integers(4, vocab, size=(rows, length)).astype(np.int32)  # noqa: E731
    return {"inputs": ids(), "targets": ids()}


def test_compiled_step_equals_jitted_step_and_donates_the_state(tiny_cfg):
    trainer = make_trainer(tiny_cfg)
    batch = sharding.global_batch(fixed_batch(), trainer.mesh)

    jitted_state, jitted_metrics = trainer.train_step(trainer.init_state(0), batch)
    state = trainer.init_state(0)
    compiled = trainer.compile_train_step(state, batch)
    assert compiled.lower_s > 0 and compiled.compile_s > 0
    # model FLOPs are the analytic count of this batch; XLA:CPU's own count sees every matmul
    # (plus the elementwise work), so it cross-checks the analytic one from above
    assert compiled.flops == batch_flops(tiny_cfg, batch) > 0
    assert compiled.flops * 0.9 <= compiled.xla_flops <= compiled.flops * 1.5
    new_state, metrics = compiled(state, batch)

    # donate_argnums=(0,) survives lowering: the old state's buffers were given to the new one
    assert all(x.is_deleted() for x in jax.tree.leaves(state.params))
    for a, b in zip(jax.tree.leaves(jitted_state), jax.tree.leaves(new_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for k in jitted_metrics:
        np.testing.assert_array_equal(np.asarray(jitted_metrics[k]), np.asarray(metrics[k]))
    # and the output keeps the state's shardings, so it feeds the next call without a copy
    for leaf, spec in zip(
        jax.tree.leaves(new_state), jax.tree.leaves(trainer.state_shardings), strict=True
    ):
        assert leaf.sharding.is_equivalent_to(spec, leaf.ndim)
    compiled(new_state, batch)  # a second step of the same shape runs the same executable
