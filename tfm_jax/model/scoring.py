"""The model of a config with its params' shapes and shardings, and what scores it on data.

Everything here is shared by training (train/trainer.py, which adds the optimizer and the train
step), evaluation (eval/evaluate.py) and decoding (decode/load.py), none of which needs more of
the others: loading a run for translation builds the model and its params' abstract shapes and
shardings, never an optimizer or a train step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from tfm_jax import platform
from tfm_jax.model import losses, sharding
from tfm_jax.model.transformer import Transformer

Batch = dict[str, jax.Array]
# The packed-batch keys beside inputs/targets (data/batching.py), passed through to the model.
SEGMENT_KEYS = (
    "inputs_segmentation",
    "targets_segmentation",
    "inputs_position",
    "targets_position",
)


def make_model(cfg: ml_collections.ConfigDict, target: str | None = None) -> Transformer:
    """`Transformer(**cfg.model)` with its bf16 product (cfg.platform.product) resolved for the
    platform its program is compiled for (`target`, default this process's backend)."""
    setting = cfg.platform.product if "platform" in cfg else "auto"
    return Transformer(**cfg.model, product=platform.resolve_product(setting, target))


def dummy_batch(length: int = 8) -> tuple[jax.Array, jax.Array]:
    """Inputs and targets of one row: what `model.init` traces the params' shapes with."""
    return jnp.ones((1, length), jnp.int32), jnp.ones((1, length), jnp.int32)


def boxed_params(model: Transformer, rng: jax.Array):
    """`model.init`'s params, still boxed with their logical axis names (nn.Partitioned)."""
    inputs, targets = dummy_batch()
    return model.init(rng, inputs, targets)["params"]


def abstract_params(
    cfg: ml_collections.ConfigDict, mesh: Mesh | None = None
) -> tuple[Transformer, Any]:
    """(model, params as jax.ShapeDtypeStruct with their shardings on `mesh`) of a config.

    Shapes come from jax.eval_shape (nothing is allocated); the shardings are those the params
    train with (their logical axes through `cfg.mesh.rules`), so a checkpoint restores into
    them as it was saved. The mesh defaults to cfg.mesh's over this process's devices.
    """
    mesh = mesh or sharding.make_mesh(cfg.mesh.data, cfg.mesh.model)
    model = make_model(cfg, platform.platform_of(mesh.devices.flat))
    rng_shape = jax.eval_shape(jax.random.PRNGKey, 0)
    with sharding.sharding_context(mesh, cfg.mesh.rules):
        boxed = jax.eval_shape(lambda rng: boxed_params(model, rng), rng_shape)
    shardings = sharding.logical_shardings(nn.get_partition_spec(boxed), mesh, cfg.mesh.rules)
    params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), nn.unbox(boxed), shardings
    )
    return model, params


def count_params(cfg: ml_collections.ConfigDict) -> int:
    """Parameter count of cfg.model from shapes alone (jax.eval_shape: nothing is allocated)."""
    model = make_model(cfg)
    shapes = jax.eval_shape(lambda rng: boxed_params(model, rng), jax.random.PRNGKey(0))
    return size_of(nn.unbox(shapes))


def size_of(params) -> int:
    """Number of parameters in a params tree (arrays or shapes)."""
    return sum(int(x.size) for x in jax.tree.leaves(params))


def model_forward(model: Transformer, params, batch: Batch, *, deterministic: bool, rngs=None):
    """Teacher-forced logits for a batch dict (packed or not)."""
    extra = {k: batch[k] for k in SEGMENT_KEYS if k in batch}
    return model.apply(
        {"params": params},
        batch["inputs"],
        batch["targets"],
        **extra,
        deterministic=deterministic,
        rngs=rngs,
    )


def eval_step(params, batch: Batch, *, model: Transformer, label_smoothing: float):
    """Summed loss / NLL / accuracy / token count of one batch (normalize on the host)."""
    logits = model_forward(model, params, batch, deterministic=True)
    return losses.cross_entropy_sums(logits, batch["targets"], label_smoothing)


def perplexity(
    eval_step: Callable[[Any, Batch], dict], params, batches, mesh: Mesh | None = None
) -> dict[str, float]:
    """Token-weighted loss, NLL, perplexity and accuracy over a split's batches (Table 3's PPL).

    The one implementation: training passes its sharded Trainer.eval_step and mesh (each batch
    placed as one global array over the mesh), evaluation the jitted eval_step of the model it
    decodes with. The sums stay on the device until the end.
    """
    total = None
    for batch in batches:
        if mesh is not None:
            batch = sharding.global_batch(batch, mesh)
        sums = eval_step(params, batch)
        total = sums if total is None else jax.tree.map(jnp.add, total, sums)
    if total is None:
        raise ValueError("perplexity of no batches: the split is empty")
    return losses.normalize_metrics(jax.device_get(total))
