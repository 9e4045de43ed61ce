"""Thin CLI: `python -m tfm_jax train|evaluate|translate|average|attention|params|compile ...`.

Configs: `--config=configs/small.py` (or `configs/table3.py:C256` for a Table 3 row), then any
number of `--config.section.key=value` overrides. A mistyped key is an error naming the closest
valid key. Commands that take `--workdir` without `--config` start from the config the run saved.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfm_jax import platform
from tfm_jax.cli import errors
from tfm_jax.cli.log_setup import only_errors_unless_primary, setup_logging
from tfm_jax.config import paths
from tfm_jax.config.build import build_config, load_config_module, split_overrides


def cmd_params(args, overrides) -> int:
    """Parameter count of each config (every row of a config file with ROWS, given no row).

    A config file may define ROWS (name -> the paper's row, with `params_millions`), selected as
    `--config=file.py:ROW` (configs/table3.py), or PAPER_ROW, the paper's row of the config
    itself (configs/big.py); the paper column comes from there.
    """
    from tfm_jax.model import scoring

    path, _, row = args.config.partition(":")
    module = load_config_module(path, typed=args.config)
    paper_rows = getattr(module, "ROWS", None)
    rows = list(paper_rows) if paper_rows is not None and not row else None
    overrides.setdefault("model.vocab_size", str(args.vocab_size))
    report = {}
    for name in rows or [row or os.path.splitext(os.path.basename(path))[0]]:
        spec = f"{path}:{name}" if rows else args.config
        cfg = build_config(spec, dict(overrides))
        if paper_rows is not None:
            paper_row = paper_rows.get(name)
        else:
            paper_row = getattr(module, "PAPER_ROW", None)
        paper = paper_row.params_millions if paper_row is not None else None
        report[name] = {"params": scoring.count_params(cfg), "paper_millions": paper}
    if args.json:
        print(json.dumps({"vocab_size": int(overrides["model.vocab_size"]), "rows": report}))
        return 0
    print(f"{'row':<9} {'params (M)':>10} {'paper (M)':>10} {'ratio':>7}")
    for name, r in report.items():
        ours = r["params"] / 1e6
        paper = r["paper_millions"]
        ratio = f"{ours / paper:7.3f}" if paper else "      -"
        print(f"{name:<9} {ours:10.1f} {paper if paper else '-':>10} {ratio}")
    return 0


def cmd_prepare(args, overrides) -> int:
    """Trains (or loads) the run's vocabulary and tokenizes the training split into the token
    cache, as `train` would at its start, so that training on many hosts starts at once."""
    import time

    from tfm_jax import data
    from tfm_jax.data.token_cache import cached_tokenize_split

    cfg = build_config(args.config, overrides)  # paths resolved; nothing here saves the config
    start = time.perf_counter()
    tokenizer = data.get_tokenizer(cfg.data, args.workdir)
    vocab_s = time.perf_counter() - start
    split = cached_tokenize_split(cfg.data, tokenizer, cfg.data.train_split, cfg.data.overlong)
    report = {
        "workdir": args.workdir,
        "vocab": getattr(tokenizer, "path", None),
        "split": cfg.data.train_split,
        "pairs": len(split),
        "source_tokens": int(split.src_offsets[-1]),
        "target_tokens": int(split.tgt_offsets[-1]),
        "vocab_s": round(vocab_s, 2),
        "tokens_s": round(time.perf_counter() - start - vocab_s, 2),
    }
    print(json.dumps(report))
    return 0


def cmd_train(args, overrides) -> int:
    """Trains (or resumes from the newest checkpoint in --workdir) to train.num_steps."""
    from tfm_jax.platform import cluster, host
    from tfm_jax.train import loop

    process = cluster.maybe_initialize_distributed(
        args.coordinator_address, args.num_processes, args.process_id
    )
    only_errors_unless_primary(process)  # one log a run: process 0's
    cfg = build_config(args.config, overrides)
    paths.resolve_config_paths(cfg, workdir=args.workdir_typed)
    platform.init_runtime(cfg)
    metrics = loop.train_and_evaluate(cfg, args.workdir)
    # each process's own result; a reader gone (a killed harness) loses this line, not the
    # stop's message or its exit code
    host.print_stdout(json.dumps({"workdir": args.workdir, **metrics}))
    if metrics.get("stopped_by"):
        from tfm_jax.train import preemption

        if process == 0:
            print(
                f"{metrics['stopped_by']}: stopped at step {metrics['step']} of "
                f"{cfg.train.num_steps} with checkpoint {metrics['step']} saved in "
                f"{args.workdir}; run the same command to resume",
                file=sys.stderr,
                flush=True,
            )
        return preemption.EXIT_CODES[metrics["stopped_by"]]
    return 0


def cmd_average(args, overrides) -> int:
    """Averages the params of the last N checkpoints into <workdir>/averaged (§6.1)."""
    from tfm_jax.checkpoint import averaging, reading
    from tfm_jax.model import scoring

    # warn=False: averaging then names each checkpoint it skips
    saved = None if args.config else reading.read_config_json(args.workdir, warn=False)
    cfg = build_config(args.config, overrides, saved)
    _, params = scoring.abstract_params(cfg)  # shapes and shardings: no optimizer is built
    result = averaging.average_checkpoints(
        args.workdir, args.last or cfg.train.average_last, params
    )
    print(json.dumps({"averaged": result.path, "steps": result.steps}))
    return 0


def cmd_plot(args, overrides) -> int:
    """Learning curves (train loss, eval perplexity, tokens/s) from metrics.jsonl as a PNG."""
    from tfm_jax.viz import curves as plots

    out = plots.plot_learning_curves(args.workdir, args.out)
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()  # tfm_jax at INFO on stderr, libraries at WARNING (cli/log_setup.py)
    try:
        argv, overrides = split_overrides(argv)
        parser = argparse.ArgumentParser(prog="python -m tfm_jax", description=__doc__)
        sub = parser.add_subparsers(dest="command", required=True)

        p = sub.add_parser("params", help="parameter counts beside the paper's column")
        p.add_argument("--config", required=True)
        p.add_argument("--vocab_size", type=int, default=37000)
        p.add_argument("--json", action="store_true")
        p.set_defaults(fn=cmd_params)

        p = sub.add_parser("train", help="train, or resume from the newest checkpoint")
        p.add_argument("--config", required=True)
        p.add_argument("--workdir", required=True)
        p.add_argument("--coordinator_address", default=None, help="host:port of process 0")
        p.add_argument("--num_processes", type=int, default=None)
        p.add_argument("--process_id", type=int, default=None)
        p.set_defaults(fn=cmd_train)

        p = sub.add_parser("prepare", help="vocabulary and token cache of the training split")
        p.add_argument("--config", required=True)
        p.add_argument("--workdir", required=True)
        p.set_defaults(fn=cmd_prepare)

        p = sub.add_parser("average", help="average the last N checkpoints (§6.1)")
        p.add_argument("--workdir", required=True)
        p.add_argument("--config", default=None, help="default: the run's saved config")
        p.add_argument("--last", type=int, default=0, help="default: train.average_last")
        p.set_defaults(fn=cmd_average)

        p = sub.add_parser("plot", help="learning curves from <workdir>/metrics.jsonl (PNG)")
        p.add_argument("--workdir", required=True)
        p.add_argument("--out", default=None, help="default: <workdir>/learning_curves.png")
        p.set_defaults(fn=cmd_plot)

        from tfm_jax.cli import fit as fit_cli  # compile
        from tfm_jax.cli import inference as inference_cli  # translate, evaluate, attention

        inference_cli.add_commands(sub)
        fit_cli.add_command(sub)

        args = parser.parse_args(argv)
        paths.resolve_args(args)  # once, here: every command below sees absolute local paths
        return args.fn(args, overrides)
    except Exception as e:
        errors.tell_the_other_processes(e)  # those waiting for this one stop with it
        code = errors.report(e)  # config errors 2, other user errors 1, one line on stderr
        if code is None:
            raise
        return code


if __name__ == "__main__":
    sys.exit(main())
