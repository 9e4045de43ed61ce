"""Golden values for the §5.3 schedule and the §5.4 label-smoothed loss."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfm_jax.model import losses
from tfm_jax.train import optim


@pytest.mark.parametrize(
    "step, expected",
    [
        # 512^-0.5 * min(step^-0.5, step * 4000^-1.5), computed by hand
        (1, 0.044194173824159216 * 1 * 4000**-1.5),  # 1.7469e-07
        (4000, 0.044194173824159216 * 4000**-0.5),  # 6.9877e-04, the peak
        (100000, 0.044194173824159216 * 100000**-0.5),  # 1.3975e-04
    ],
)
def test_schedule_golden(step, expected):
    schedule = optim.rsqrt_warmup_schedule(d_model=512, warmup_steps=4000)
    # optax passes count = step - 1 (counts from 0); the paper counts steps from 1
    np.testing.assert_allclose(float(schedule(step - 1)), expected, rtol=1e-6)


def test_schedule_literal_values():
    schedule = optim.rsqrt_warmup_schedule(d_model=512, warmup_steps=4000)
    np.testing.assert_allclose(float(schedule(0)), 1.7469281e-07, rtol=1e-5)
    np.testing.assert_allclose(float(schedule(3999)), 6.9877124e-04, rtol=1e-5)
    np.testing.assert_allclose(float(schedule(99999)), 1.3975425e-04, rtol=1e-5)
    assert np.isfinite(float(schedule(0)))


def test_optimizer_is_paper_adam():
    tx = optim.make_optimizer(d_model=512, warmup_steps=4000)
    params = {"w": jnp.ones((3,))}
    state = tx.init(params)
    grads = {"w": jnp.array([1.0, -2.0, 0.5])}
    updates, _ = tx.update(grads, state, params)
    # first Adam step: m_hat = g, v_hat = g^2 -> update = -lr * g / (|g| + eps) = -lr * sign(g)
    lr = 0.044194173824159216 * 4000**-1.5
    np.testing.assert_allclose(np.asarray(updates["w"]), -lr * np.sign([1.0, -2.0, 0.5]), rtol=1e-5)


def test_gradient_accumulation_matches_big_batch():
    params = {"w": jnp.array([0.3, -0.1])}
    g1, g2 = {"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([3.0, -1.0])}
    acc = optim.make_optimizer(d_model=16, warmup_steps=2, accumulate_steps=2)
    big = optim.make_optimizer(d_model=16, warmup_steps=2)
    s = acc.init(params)
    u1, s = acc.update(g1, s, params)
    assert np.all(np.asarray(u1["w"]) == 0)  # no update until the second micro-batch
    u2, s = acc.update(g2, s, params)
    mean = {"w": (g1["w"] + g2["w"]) / 2}
    ub, _ = big.update(mean, big.init(params), params)
    np.testing.assert_allclose(np.asarray(u2["w"]), np.asarray(ub["w"]), rtol=1e-6)


def _numpy_smoothed_loss(logits, targets, eps, pad=0):
    logits = np.asarray(logits, np.float64)
    vocab = logits.shape[-1]
    logp = logits - np.log(np.sum(np.exp(logits), axis=-1, keepdims=True))
    loss = nll = tokens = 0.0
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            y = targets[b, t]
            if y == pad:
                continue
            q = np.full(vocab, eps / (vocab - 1))
            q[y] = 1.0 - eps
            loss += -np.sum(q * logp[b, t])
            nll += -logp[b, t, y]
            tokens += 1
    return loss, nll, tokens


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_label_smoothed_loss_against_numpy(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    targets = np.array([[3, 1, 4, 0, 0], [5, 2, 6, 1, 0]])
    got = losses.cross_entropy_sums(jnp.asarray(logits), jnp.asarray(targets), eps)
    loss, nll, tokens = _numpy_smoothed_loss(logits, targets, eps)
    np.testing.assert_allclose(float(got["loss"]), loss, rtol=1e-5)
    np.testing.assert_allclose(float(got["nll"]), nll, rtol=1e-5)
    assert float(got["tokens"]) == tokens == 7


def test_optax_smoothing_agrees():
    # cross-check the closed form with optax's smoothed-label cross entropy on one token
    logits = jnp.array([[0.2, -1.0, 2.0, 0.5]])
    eps, vocab = 0.1, 4
    q = jnp.full((1, vocab), eps / (vocab - 1)).at[0, 2].set(1 - eps)
    expected = optax.softmax_cross_entropy(logits, q)[0]
    got = losses.cross_entropy_sums(logits[None], jnp.array([[2]]), eps)["loss"]
    np.testing.assert_allclose(float(got), float(expected), rtol=1e-6)


def test_normalize_metrics_perplexity():
    m = losses.normalize_metrics({"loss": 6.0, "nll": 4.0, "correct": 1.0, "tokens": 2.0})
    assert m["nll"] == 2.0 and abs(m["ppl"] - np.exp(2.0)) < 1e-9 and m["accuracy"] == 0.5
