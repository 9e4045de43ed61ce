"""Decoding benchmark: sentences/s and generated tokens/s, beam 4 (§6.1) and greedy.

Each mode runs the test split twice: once to compile every batch shape, then a timed pass.
With no --workdir the model is randomly initialized: it rarely emits EOS, so nearly every
output runs to its length limit (source length + decode.max_extra_len), a worst case for
sentences/s; tokens/s is the comparable number.

Standalone: `python -m experiments.bench.decode [--config=configs/small.py] [--workdir=DIR]
[--limit=N] [--config.decode.tokens_per_batch=...]` prints one JSON line; `python -m
experiments.bench decode` is the same benchmark beside the others.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import flax.linen as nn
import jax
import ml_collections

from tfm_jax import data, platform
from tfm_jax.checkpoint import reading
from tfm_jax.config import paths
from tfm_jax.decode import load, translate
from tfm_jax.model import scoring


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench_decode(
    cfg: ml_collections.ConfigDict, workdir: str | None = None, limit: int | None = None
) -> dict:
    """Beam-4 and greedy decoding speed on cfg.data.test_split, measured after compilation."""
    if workdir:
        which = load.default_checkpoint(workdir)
        model, params, tokenizer = load.load_for_inference(workdir, which, cfg)
    else:
        which = "random init"
        model = scoring.make_model(cfg)
        # the params a run starts from (its init_state calls the same init with this key)
        params = nn.unbox(scoring.boxed_params(model, jax.random.PRNGKey(cfg.train.seed)))
        # Shared with input_pipeline.py: the vocabulary is keyed by the data, so reuse is safe.
        vocab_dir = os.path.join(tempfile.gettempdir(), "tfm_jax_bench_input")
        tokenizer = data.get_tokenizer(cfg.data, vocab_dir)
    sources, _ = data.load_split_texts(cfg.data, cfg.data.test_split)
    sources = sources[:limit] if limit else sources
    ids = tokenizer.encode_batch(sources)

    result = {
        "split": cfg.data.test_split,
        "num_sentences": len(sources),
        "checkpoint": which,
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "tokens_per_batch": cfg.decode.tokens_per_batch,
        "max_extra_len": cfg.decode.max_extra_len,
        "alpha": cfg.decode.alpha,
        "decode_devices": jax.local_device_count(),  # batches decoded at once (translate_ids)
    }
    stats = translate.DecodeStats()
    for name, kw in (("beam4", dict(beam_size=4)), ("greedy", dict(greedy=True))):

        def run(kw=kw):
            return translate.translate_ids(cfg, model, params, ids, stats=stats, **kw)

        _, first = _timed(run)  # compiles each batch shape
        outs, seconds = _timed(run)
        tokens = sum(len(o) for o in outs)  # generated tokens incl. EOS
        result[f"{name}_sentences_per_s"] = round(len(sources) / seconds, 2)
        result[f"{name}_tokens_per_s"] = round(tokens / seconds, 1)
        result[f"{name}_seconds"] = round(seconds, 3)
        result[f"{name}_first_pass_seconds"] = round(first, 3)  # compilation included
        result[f"{name}_mean_output_tokens"] = round(tokens / max(1, len(outs)), 2)
    result["compilations"] = len(stats.programs)
    # Sentences the short first pass did not finish, per timed pass of each mode.
    result["redecoded_per_pass"] = stats.redecoded / 4
    result["first_pass_extra_len"] = cfg.decode.first_pass_extra_len
    return result


def main(argv=None) -> int:
    from tfm_jax.config.build import build_config, split_overrides

    argv, overrides = split_overrides(list(sys.argv[1:] if argv is None else argv))
    parser = argparse.ArgumentParser(prog="python -m experiments.bench.decode", description=__doc__)
    parser.add_argument("--config", default=None, help="default configs/small.py (or the run's)")
    parser.add_argument("--workdir", default=None, help="a trained run; default: random init")
    parser.add_argument("--limit", type=int, default=None, help="first N test sentences")
    parser.add_argument("--cpu_devices", type=int, default=None, help="as `evaluate`'s")
    args = parser.parse_args(argv)
    paths.resolve_args(args)
    platform.split_cpu_devices(args.cpu_devices)
    spec = args.config or (None if args.workdir else "configs/small.py")
    saved = reading.read_config_json(args.workdir) if spec is None else None
    cfg = build_config(spec, overrides, saved)
    print(json.dumps(bench_decode(cfg, args.workdir, args.limit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
