"""§5.3 the optimizer: Adam(0.9, 0.98, 1e-9) with the rsqrt warmup schedule."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def rsqrt_warmup_schedule(d_model: int, warmup_steps: int, factor: float = 1.0) -> optax.Schedule:
    """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (§5.3, eq. 3).

    optax counts updates from 0; the paper's step counts from 1, so step = count + 1 (no
    division by zero, and the first update already has a non-zero learning rate).
    """

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        return (
            factor
            * d_model**-0.5
            * jnp.minimum(step**-0.5, step * jnp.float32(warmup_steps) ** -1.5)
        )

    return schedule


def make_optimizer_and_schedule(
    d_model: int,
    warmup_steps: int = 4000,
    lr_factor: float = 1.0,
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-9,
    grad_clip_norm: float = 0.0,
    accumulate_steps: int = 1,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax chain for `make_optimizer_and_schedule(**cfg.optim)`, and its lr schedule.

    The schedule is the one Adam uses, built once: `schedule(n)` is the learning rate of the
    (n+1)-th real update (what the training loop logs as `lr`).

    grad_clip_norm > 0 adds global-norm clipping (not in the paper). accumulate_steps > 1 sums
    gradients over that many micro-batches before one Adam update (optax.MultiSteps), so the
    paper's ~25k-token batch fits on fewer devices; the schedule then counts real updates.
    """
    if warmup_steps < 1:
        raise ValueError(f"optim.warmup_steps must be >= 1, got {warmup_steps}")
    if accumulate_steps < 1:
        raise ValueError(f"optim.accumulate_steps must be >= 1, got {accumulate_steps}")
    schedule = rsqrt_warmup_schedule(d_model, warmup_steps, lr_factor)
    parts = []
    if grad_clip_norm > 0:
        parts.append(optax.clip_by_global_norm(grad_clip_norm))
    parts.append(optax.adam(schedule, b1=b1, b2=b2, eps=eps))
    tx = optax.chain(*parts)
    if accumulate_steps > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=accumulate_steps)
    return tx, schedule


def make_optimizer(*args, **kwargs) -> optax.GradientTransformation:
    """The optax chain alone: `make_optimizer(**cfg.optim)` (see make_optimizer_and_schedule)."""
    return make_optimizer_and_schedule(*args, **kwargs)[0]
