"""TrainState, the pure train step, and the sharded, jitted train and eval steps of a run.

The model, its params' shapes and the eval step it shares with evaluation are model/scoring.py's.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh

from tfm_jax import platform
from tfm_jax.model import flops, losses, scoring, sharding
from tfm_jax.model.scoring import Batch
from tfm_jax.model.transformer import Transformer
from tfm_jax.train import optim, prng


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs besides the data position: Adam's moments included."""

    step: jax.Array  # int32 []: train_step calls so far (micro-steps under accumulation)
    params: Any
    opt_state: Any
    rng: jax.Array  # raw uint32 key: dropout rngs are fold_in(rng, step)


def train_step(
    state: TrainState,
    batch: Batch,
    *,
    model: Transformer,
    tx: optax.GradientTransformation,
    label_smoothing: float,
    dropout_prng: str,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on one batch: mean smoothed loss over the batch's target tokens."""
    dropout_rng = prng.dropout_key(jax.random.fold_in(state.rng, state.step), dropout_prng)

    def loss_fn(params):
        logits = scoring.model_forward(
            model, params, batch, deterministic=False, rngs={"dropout": dropout_rng}
        )
        sums = losses.cross_entropy_sums(logits, batch["targets"], label_smoothing)
        loss = sums["loss"] / jnp.maximum(sums["tokens"], 1.0)
        return loss, sums

    (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(sums)  # a NaN/Inf loss is a NaN/Inf metrics["loss"]: the loop stops on it
    metrics["grad_norm"] = optax.global_norm(grads)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


@dataclasses.dataclass
class CompiledStep:
    """The train step lowered and compiled ahead of time for one batch shape, and what it cost.

    Calling it runs the executable: same shardings and the same donated state buffers as
    `Trainer.train_step_fn`, from the same HLO, so the same numbers.
    """

    executable: jax.stages.Compiled
    # one step, all devices: model FLOPs, model/flops.py's matmul count (MFU's numerator, the
    # same on every backend, scanned or not)
    flops: float
    lower_s: float  # tracing + lowering to HLO
    compile_s: float  # XLA's compilation alone
    # XLA's own count (elementwise work too), a cross-check; 0.0 where it has none or the stack
    # is scanned (a while loop's body is counted once)
    xla_flops: float = 0.0

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        return self.executable(state, batch)


def xla_flops(lowered: jax.stages.Lowered, compiled: jax.stages.Compiled, devices: int) -> float:
    """FLOPs of one step, all devices, from XLA's cost analysis; 0.0 where XLA gives none.

    Lowered.cost_analysis is the whole program's, before partitioning; it is None where the
    backend is a PJRT plugin or the devices are compile-only: there the compiled program's count
    is used, which is per device (the SPMD-partitioned program).

    Not the model FLOPs: on an H200 (JAX 0.11.2, bf16) XLA:GPU counted 53% of the base step's
    matmuls and 62% of big's (experiments/results/gpu_check_20261204.md); XLA:CPU counts them all
    plus the elementwise work.
    """
    for cost, scale in ((lowered, 1), (compiled, devices)):
        try:
            got = cost.cost_analysis()
        except Exception:  # noqa: BLE001  (metadata, never a reason to stop)
            continue
        got = got[0] if isinstance(got, (list, tuple)) and got else got
        if got and float(got.get("flops", 0.0)) > 0:
            return float(got["flops"]) * scale
    return 0.0


def batch_flops(cfg: ml_collections.ConfigDict, batch: Batch) -> float:
    """model/flops.py's analytic count of a train step on this (global) batch's shape."""
    rows, src_len = batch["inputs"].shape
    return flops.matmul_flops(cfg.model, rows, src_len, batch["targets"].shape[1])


@dataclasses.dataclass
class Trainer:
    """The model, optimizer and mesh of a run, with its jitted, sharded step functions."""

    cfg: ml_collections.ConfigDict
    mesh: Mesh
    model: Transformer
    tx: optax.GradientTransformation
    schedule: optax.Schedule  # the learning rate tx applies at update count n: schedule(n)
    state_shardings: Any
    abstract_state: Any  # TrainState of jax.ShapeDtypeStruct with shardings (for restoring)
    init_fn: Callable[[jax.Array], TrainState]
    train_step_fn: Callable[[TrainState, Batch], tuple[TrainState, dict]]
    eval_step_fn: Callable[[Any, Batch], dict]

    @property
    def param_shardings(self):
        return self.state_shardings.params

    def init_state(self, seed: int) -> TrainState:
        with self.context():
            return self.init_fn(jax.random.PRNGKey(seed))

    def context(self):
        return sharding.sharding_context(self.mesh, self.cfg.mesh.rules)

    def train_step(self, state: TrainState, batch: Batch):
        with self.context():
            return self.train_step_fn(state, batch)

    def compile_train_step(
        self,
        state: TrainState,
        batch: Batch,
        compiler_options: dict | None = None,
        report: Callable[[str], None] = lambda message: None,
    ) -> CompiledStep:
        """Lowers and compiles train_step_fn for these arguments' shapes, timing each phase.

        compiler_options: XLA options for this compilation (experiments/bench/step.py's variants).
        report: told when lowering is done and XLA starts, which can take minutes.
        """
        with self.context():  # the logical-axis rules apply while tracing
            start = time.perf_counter()
            lowered = self.train_step_fn.lower(state, batch)
            lowered_at = time.perf_counter()
            report(f"lowered in {lowered_at - start:.1f} s; compiling")
            compiled = lowered.compile(compiler_options=compiler_options or None)
            done = time.perf_counter()
        scanned = bool(self.cfg.model.scan_layers)
        counted = 0.0 if scanned else xla_flops(lowered, compiled, self.mesh.devices.size)
        return CompiledStep(
            compiled, batch_flops(self.cfg, batch), lowered_at - start, done - lowered_at, counted
        )

    def eval_step(self, params, batch: Batch):
        with self.context():
            return self.eval_step_fn(params, batch)


def make_trainer(cfg: ml_collections.ConfigDict, mesh: Mesh | None = None) -> Trainer:
    """Builds the model and optimizer, derives every sharding from logical axis names, and jits.

    Shapes come from jax.eval_shape (no weights are allocated until init_state); params, Adam
    moments and gradient accumulators inherit the params' logical axes, so with mesh.model > 1
    they are split the same way.
    """
    mesh = mesh or sharding.make_mesh(cfg.mesh.data, cfg.mesh.model)
    target = platform.platform_of(mesh.devices.flat)  # compile-only devices: not the host's
    model = scoring.make_model(cfg, target)  # its numerics resolved for that target
    tx, schedule = optim.make_optimizer_and_schedule(**cfg.optim)  # the loop logs schedule

    def boxed_init(rng):
        params = scoring.boxed_params(model, rng)
        # optax maps over the LogicallyPartitioned boxes, so its state carries the axis names too
        return TrainState(
            step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params), rng=rng
        )

    rng_shape = jax.eval_shape(jax.random.PRNGKey, 0)  # uint32 [2] (threefry) or [4] (rbg)
    with sharding.sharding_context(mesh, cfg.mesh.rules):
        abstract_boxed = jax.eval_shape(boxed_init, rng_shape)
    specs = nn.get_partition_spec(abstract_boxed)
    state_shardings = sharding.logical_shardings(specs, mesh, cfg.mesh.rules)
    abstract_state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        nn.unbox(abstract_boxed),
        state_shardings,
    )

    init_fn = jax.jit(lambda rng: nn.unbox(boxed_init(rng)), out_shardings=state_shardings)
    metric_sharding = sharding.replicated(mesh)
    batch_sharding = sharding.batch_sharding(mesh)
    step = functools.partial(
        train_step,
        model=model,
        tx=tx,
        label_smoothing=cfg.loss.label_smoothing,
        dropout_prng=platform.dropout_prng(cfg.train.dropout_prng, target),
    )
    train_step_fn = jax.jit(
        step,
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, metric_sharding),
        donate_argnums=(0,),
    )
    eval_fn = jax.jit(
        functools.partial(scoring.eval_step, model=model, label_smoothing=cfg.loss.label_smoothing),
        in_shardings=(state_shardings.params, batch_sharding),
        out_shardings=metric_sharding,
    )
    return Trainer(
        cfg=cfg,
        mesh=mesh,
        model=model,
        tx=tx,
        schedule=schedule,
        state_shardings=state_shardings,
        abstract_state=abstract_state,
        init_fn=init_fn,
        train_step_fn=train_step_fn,
        eval_step_fn=eval_fn,
    )
