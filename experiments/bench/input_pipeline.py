"""Input pipeline benchmark: padding efficiency, shapes and batches/s on cfg.data's train split.

Standalone: `python -m experiments.bench.input_pipeline [--packing] [--tokens_per_batch=N]`
prints one JSON line. `python -m experiments.bench input` calls `bench_input(cfg)` and adds the
train-step rate.

At WMT scale (issue 16): `python -m experiments.bench.input_pipeline --scale=4500000` builds a
synthetic folder of that many pairs by repeating ../shared/data/wmt14-en-de/news2008-2012 (under
--scratch, default the temp dir; never in the repo), then times, each in a fresh process so that
peak memory is the pipeline's own: a cold start (vocabulary, token cache build, first batch),
a warm start (cache present: first batch, batches/s, peak RSS), and the warm start as 2 hosts
(process_count=2, process_index 0 and 1 run at once: each host's first batch and RSS). One JSON
line with pairs, vocab_s, cold_build_s, warm_first_batch_s, batches_per_s, peak_rss_bytes.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import ml_collections

from experiments import REPO
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


NEWS = os.path.join(REPO, "..", "shared", "data", "wmt14-en-de")


def make_scale_folder(pairs: int, scratch: str) -> str:
    """<scratch>/tfm_jax_scale_<pairs>/{train,val}.{en,de}: news2008-2012 repeated to `pairs`."""
    folder = os.path.join(scratch, f"tfm_jax_scale_{pairs}")
    if os.path.exists(os.path.join(folder, "done")):
        return folder
    os.makedirs(folder, exist_ok=True)
    for lang in ("en", "de"):
        with open(os.path.join(NEWS, f"news2008-2012.{lang}"), encoding="utf-8") as f:
            lines = f.readlines()
        with open(os.path.join(folder, f"train.{lang}"), "w", encoding="utf-8") as f:
            for i in range(pairs):
                f.write(lines[i % len(lines)])
        with open(os.path.join(NEWS, f"newstest2013.{lang}"), encoding="utf-8") as src:
            with open(os.path.join(folder, f"val.{lang}"), "w", encoding="utf-8") as f:
                f.write(src.read())
    open(os.path.join(folder, "done"), "w").close()
    return folder


def scale_child(args) -> dict:
    """One process: vocabulary, iterator (token cache: cold builds it, warm reads it), first
    batch, then batches/s over --scale_batches batches; peak RSS of this process."""
    cfg = ml_collections.ConfigDict({"data": data.default_data_config()})
    cfg.data.dir = args.dir
    cfg.data.vocab_size = args.vocab_size
    cfg.data.tokens_per_batch = args.tokens_per_batch
    cfg.data.packing = args.packing
    start = time.perf_counter()
    tokenizer = data.get_tokenizer(cfg.data, args.workdir)
    vocab_s = time.perf_counter() - start
    it = data.make_train_iterator(
        cfg.data, tokenizer, seed=0, process_index=args.process_index,
        process_count=args.process_count,
    )  # fmt: skip
    batch = next(it)
    first = time.perf_counter()
    n = 0
    while n < args.scale_batches:
        next(it)
        n += 1
    rate = n / (time.perf_counter() - first)
    shape = [list(v.shape) for v in batch.values()][:2]
    return {
        "vocab_s": round(vocab_s, 2),
        "first_batch_s": round(first - start, 2),  # from process start of the pipeline
        "iterator_s": round(first - start - vocab_s, 2),  # tokenize or open cache, plan, batch 1
        "batches_per_s": round(rate, 1),
        "local_batch_shapes": shape,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def bench_scale(args) -> dict:
    folder = make_scale_folder(args.scale, args.scratch)
    workdir = os.path.join(args.scratch, f"tfm_jax_scale_{args.scale}_work")
    if not args.warm_only:
        # A cold start: no vocabulary, and so no token cache (it lives in vocab/tokens/).
        shutil.rmtree(os.path.join(workdir, "vocab"), ignore_errors=True)
    elif not os.path.isdir(os.path.join(workdir, "vocab", "tokens")):
        raise SystemExit(f"--warm_only: no token cache under {workdir}; run once without it")

    def child(process_index=0, process_count=1):
        argv = [sys.executable, "-m", "experiments.bench.input_pipeline", "--_child",
                f"--dir={folder}", f"--workdir={workdir}", f"--vocab_size={args.vocab_size}",
                f"--tokens_per_batch={args.tokens_per_batch}",
                f"--scale_batches={args.scale_batches}", f"--process_index={process_index}",
                f"--process_count={process_count}"]  # fmt: skip
        argv += ["--packing"] if args.packing else []
        return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)

    def result(p):
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"scale child failed (exit {p.returncode})")
        return json.loads(out.strip().splitlines()[-1])

    cold = {"vocab_s": None, "iterator_s": None, "peak_rss_bytes": None}
    cold.update({} if args.warm_only else result(child()))
    warm = result(child())
    hosts = [child(i, 2) for i in range(2)]
    two = [result(p) for p in hosts]
    return {
        "bench": "input_scale",
        "pairs": args.scale,
        "tokens_per_batch": args.tokens_per_batch,
        "vocab_size": args.vocab_size,
        "packing": args.packing,
        "vocab_s": cold["vocab_s"],
        "cold_build_s": cold["iterator_s"],  # tokenize into the cache (workers), plan, batch 1
        "cold_peak_rss_bytes": cold["peak_rss_bytes"],
        "warm_first_batch_s": warm["first_batch_s"],
        "batches_per_s": warm["batches_per_s"],
        "peak_rss_bytes": warm["peak_rss_bytes"],
        "global_batch_shapes": warm["local_batch_shapes"],
        "two_hosts": [
            {
                k: h[k]
                for k in ("first_batch_s", "batches_per_s", "peak_rss_bytes", "local_batch_shapes")
            }
            for h in two
        ],  # fmt: skip
    }


def main():
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench.input_pipeline", description=__doc__
    )
    parser.add_argument("--dir", default=os.path.join(REPO, "..", "shared", "data", "multi30k"))
    parser.add_argument("--tokens_per_batch", type=int, default=4096)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--packing", action="store_true")
    parser.add_argument("--batch_multiple", type=int, default=1)
    parser.add_argument("--scale", type=int, default=0, help="synthetic WMT-sized run: pairs")
    parser.add_argument("--scratch", default=tempfile.gettempdir(), help="--scale's folders")
    parser.add_argument("--scale_batches", type=int, default=200)
    parser.add_argument(
        "--warm_only", action="store_true", help="--scale: keep the cache; skip the cold start"
    )
    parser.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--process_index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--process_count", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        print(json.dumps(scale_child(args)))
        return
    if args.scale:
        args.scratch = paths.resolve(args.scratch)
        print(json.dumps(bench_scale(args)))
        return
    cfg = ml_collections.ConfigDict({"data": data.default_data_config()})
    cfg.data.dir = paths.resolve(args.dir)
    cfg.data.tokens_per_batch = args.tokens_per_batch
    cfg.data.vocab_size = args.vocab_size
    cfg.data.packing = args.packing
    print(json.dumps(bench_input(cfg, batch_multiple=args.batch_multiple)))


if __name__ == "__main__":
    main()
