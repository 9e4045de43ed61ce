"""A run's model, params and vocabulary for decoding: "averaged", "latest" or a step (§6.1);
or several runs' at once, an ensemble sharing one vocabulary.

A run trained with model.scan_layers comes back unrolled: the decoder's cache is per layer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import ml_collections

from tfm_jax.checkpoint import errors as ckpt_errors
from tfm_jax.checkpoint import layout as ckpt_layout
from tfm_jax.checkpoint import reading
from tfm_jax.config import paths
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.model import scoring, transformer
from tfm_jax.model.transformer import Transformer
from tfm_jax.platform import storage

log = logging.getLogger(__name__)


class InferenceError(ValueError):
    """A user-fixable problem (missing workdir, checkpoint, vocabulary or input file)."""


def default_checkpoint(workdir: str) -> str:
    """CLI default: "averaged" (§6.1 averages the last checkpoints) if it exists, else latest."""
    return (
        "averaged" if storage.isdir(storage.join(workdir, ckpt_layout.AVERAGED_DIR)) else "latest"
    )


def check_workdir(workdir: str) -> None:
    if not workdir or not storage.isdir(workdir):
        raise InferenceError(
            f"workdir {workdir!r} does not exist; pass the --workdir of a training run"
        )


def load_tokenizer(cfg: ml_collections.ConfigDict, workdir: str) -> Tokenizer:
    """The run's vocabulary: data.vocab_path, else the one training cached under <workdir>/vocab.

    Never trains one: a new vocabulary would not match the model's embedding rows. Looking in
    <workdir>/vocab (rather than recomputing get_tokenizer's fingerprint) keeps evaluation of
    another folder (--config.data.dir=...) on the run's own vocabulary.
    """
    if cfg.data.vocab_path:
        trained_in = cfg.paths.get("workdir")
        path = paths.pinned_file(cfg.data.vocab_path, trained_in, workdir)
        if path is None:
            raise InferenceError(
                f"data.vocab_path={cfg.data.vocab_path!r} does not exist (the run was trained "
                f"in {trained_in!r}); pass --config.data.vocab_path=<the run's sentencepiece "
                ".model>"
            )
        return Tokenizer.load(path, cfg.data.num_workers)
    vocab = storage.path(storage.join(workdir, "vocab"))
    pattern = storage.join(workdir, "vocab", f"spm_{cfg.data.vocab_size}_*.model")
    matches = vocab.glob(f"spm_{cfg.data.vocab_size}_*.model") if vocab.is_dir() else []
    found = [os.fspath(m) for m in sorted(matches, key=lambda m: m.stat().mtime)]
    if not found:
        raise InferenceError(
            f"no vocabulary matches {pattern}; pass --config.data.vocab_path=<the run's "
            "sentencepiece .model>"
        )
    if len(found) > 1:
        log.warning("Several vocabularies match %s; using the newest, %s", pattern, found[-1])
    return Tokenizer.load(found[-1], cfg.data.num_workers)


def load_for_inference(
    workdir: str, which: str | int, cfg: ml_collections.ConfigDict
) -> tuple[Transformer, Any, Tokenizer]:
    """(model, params, tokenizer) of `which` checkpoint: "averaged", "latest" or a step.

    A run trained with model.scan_layers comes back unrolled (the decoder's cache is per layer).
    """
    check_workdir(workdir)
    model, abstract = scoring.abstract_params(cfg)  # no optimizer, no train step
    try:
        params = reading.load_params(workdir, str(which), abstract)
    except ckpt_errors.CheckpointNotFoundError as e:  # it lists the steps the workdir holds
        raise InferenceError(str(e)) from None
    except ValueError as e:  # a `which` that is neither a name nor a step
        raise InferenceError(f"--checkpoint={which}: {e}") from None
    tokenizer = load_tokenizer(cfg, workdir)
    if tokenizer.vocab_size > cfg.model.vocab_size:
        raise InferenceError(
            f"the vocabulary has {tokenizer.vocab_size} pieces but model.vocab_size is "
            f"{cfg.model.vocab_size}; this vocabulary belongs to another run"
        )
    if cfg.model.scan_layers:
        model = model.clone(scan_layers=False)
        return model, transformer.unstack_layers(params, cfg.model.num_layers), tokenizer
    return model, params, tokenizer


def load_ensemble(
    workdirs: Sequence[str], which: Sequence[str | int], cfgs: Sequence[ml_collections.ConfigDict]
) -> tuple[tuple[Transformer, ...], tuple[Any, ...], Tokenizer]:
    """(models, params, tokenizer) of several runs, for decode/translate's ensembles.

    Member i is checkpoint which[i] of workdirs[i] built with cfgs[i] (its own shape: members
    may differ in size). They must share one vocabulary, compared by content (the pieces the
    ids mean), not by file name; the first member's tokenizer is returned.
    """
    if not (len(workdirs) == len(which) == len(cfgs)) or not workdirs:
        raise ValueError("load_ensemble needs one checkpoint and one config per workdir")
    loaded = [
        load_for_inference(w, c, cfg) for w, c, cfg in zip(workdirs, which, cfgs, strict=True)
    ]
    tokenizer = loaded[0][2]
    for workdir, (_, _, other) in zip(workdirs[1:], loaded[1:], strict=True):
        if other.content_hash != tokenizer.content_hash:
            raise InferenceError(
                f"ensemble member {workdir!r} has another vocabulary than {workdirs[0]!r} "
                f"({other.path} against {tokenizer.path}); an ensemble's members must be "
                "trained on one vocabulary (set --config.data.vocab_path to the same .model)"
            )
    models = tuple(m for m, _, _ in loaded)
    params = tuple(p for _, p, _ in loaded)
    return models, params, tokenizer
