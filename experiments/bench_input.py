"""Input pipeline benchmark: padding efficiency, shapes and batches/s on cfg.data's train split.

Standalone: `python experiments/bench_input.py [--packing] [--tokens_per_batch=N]` prints one
JSON line. `experiments/bench.py` calls `bench_input(cfg)` and adds the train-step rate.
"""

import argparse
import json
import os
import tempfile
import time

import ml_collections

from tfm_jax import data
from tfm_jax.config import paths
from tfm_jax.data.batching import timed_epoch


def bench_input(
    cfg: ml_collections.ConfigDict, workdir: str | None = None, batch_multiple: int = 1
) -> dict:
    """One epoch of the training iterator for `cfg.data`: efficiency, shapes and speed."""
    workdir = workdir or os.path.join(tempfile.gettempdir(), "tfm_jax_bench_input")
    start = time.perf_counter()
    tokenizer = data.get_tokenizer(cfg.data, workdir)
    it = data.make_train_iterator(cfg.data, tokenizer, seed=0, batch_multiple=batch_multiple)
    setup_s = time.perf_counter() - start
    batches, seconds = timed_epoch(it)  # includes computing the epoch's batch plan
    stats = data.padding_efficiency(batches)
    return {
        "padding_efficiency": round(stats["padding_efficiency"], 4),
        "inputs_efficiency": round(stats["inputs_efficiency"], 4),
        "targets_efficiency": round(stats["targets_efficiency"], 4),
        "distinct_shapes": stats["distinct_shapes"],
        "batch_shapes": [list(s) for s in it.global_shapes()],
        "num_batches": stats["num_batches"],
        "pipeline_batches_per_s": round(stats["num_batches"] / seconds, 1),
        "real_tokens_per_batch": round(stats["real_tokens"] / stats["num_batches"], 1),
        "tokens_per_batch": cfg.data.tokens_per_batch,
        "packing": cfg.data.packing,
        "vocab_size": tokenizer.vocab_size,
        "setup_s": round(setup_s, 2),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--dir",
        default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "multi30k"),
    )
    parser.add_argument("--tokens_per_batch", type=int, default=4096)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--packing", action="store_true")
    parser.add_argument("--batch_multiple", type=int, default=1)
    args = parser.parse_args()
    cfg = ml_collections.ConfigDict({"data": data.default_data_config()})
    cfg.data.dir = paths.resolve(args.dir)
    cfg.data.tokens_per_batch = args.tokens_per_batch
    cfg.data.vocab_size = args.vocab_size
    cfg.data.packing = args.packing
    print(json.dumps(bench_input(cfg, batch_multiple=args.batch_multiple)))


if __name__ == "__main__":
    main()
