"""Thin CLI: `python -m tfm_jax train|evaluate|translate|average|attention|params ...`.

Configs: `--config=configs/small.py` (or `configs/table3.py:C256` for a Table 3 row), then any
number of `--config.section.key=value` overrides. A mistyped key is an error naming the closest
valid key. Commands that take `--workdir` without `--config` start from the config the run saved.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # before JAX is imported: see platform/host.py
    from tfm_jax.platform import host

    host.reexec_with_malloc_tunables(["-m", "tfm_jax", *sys.argv[1:]])

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402

from tfm_jax.config import core as config_lib  # noqa: E402
from tfm_jax import platform
from tfm_jax.config import paths  # noqa: E402
from tfm_jax.config.build import build_config, split_overrides  # noqa: E402


def _user_facing_errors() -> tuple[type[BaseException], ...]:
    """Errors a user can cause (bad data, missing checkpoint, NaN loss): a message, no traceback."""
    from tfm_jax import data
    from tfm_jax.checkpoint import manager as checkpoint
    from tfm_jax.train import loop

    return (
        data.DataError,
        checkpoint.CheckpointNotFoundError,
        checkpoint.CheckpointRestoreError,
        checkpoint.NonFiniteStateError,
        loop.NonFiniteLossError,
        FileNotFoundError,
    )


def cmd_params(args, overrides) -> int:
    """Parameter count of each config (every Table 3 row for configs/table3.py without a row)."""
    from tfm_jax.train import trainer as train

    path, _, row = args.config.partition(":")
    rows = list(config_lib.TABLE3) if os.path.basename(path) == "table3.py" and not row else None
    overrides.setdefault("model.vocab_size", str(args.vocab_size))
    report = {}
    for name in rows or [row or os.path.splitext(os.path.basename(path))[0]]:
        spec = f"{path}:{name}" if rows else args.config
        cfg = build_config(spec, dict(overrides))
        paper = config_lib.TABLE3[name].params_millions if name in config_lib.TABLE3 else None
        report[name] = {"params": train.count_params(cfg), "paper_millions": paper}
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


def cmd_train(args, overrides) -> int:
    """Trains (or resumes from the newest checkpoint in --workdir) to train.num_steps."""
    from tfm_jax.train import loop
    from tfm_jax.train import sharding

    sharding.maybe_initialize_distributed(
        args.coordinator_address, args.num_processes, args.process_id
    )
    cfg = build_config(args.config, overrides)
    paths.resolve_config_paths(cfg, workdir=args.workdir_typed)
    platform.init_runtime(cfg)
    metrics = loop.train_and_evaluate(cfg, args.workdir)
    print(json.dumps({"workdir": args.workdir, **metrics}))
    if metrics.get("stopped_by"):
        from tfm_jax.train import preemption

        print(
            f"{metrics['stopped_by']}: stopped at step {metrics['step']} of "
            f"{cfg.train.num_steps} with checkpoint {metrics['step']} saved in {args.workdir}; "
            "run the same command to resume",
            file=sys.stderr,
            flush=True,
        )
        return preemption.EXIT_CODES[metrics["stopped_by"]]
    return 0


def cmd_average(args, overrides) -> int:
    """Averages the params of the last N checkpoints into <workdir>/averaged (§6.1)."""
    from tfm_jax.checkpoint import manager as checkpoint
    from tfm_jax.train import trainer as train

    cfg = build_config(args.config, overrides, workdir=args.workdir)
    trainer = train.make_trainer(cfg)
    result = checkpoint.average_checkpoints(
        args.workdir, args.last or cfg.train.average_last, trainer.abstract_state.params
    )
    print(json.dumps({"averaged": result.path, "steps": result.steps}))
    return 0


def cmd_plot(args, overrides) -> int:
    """Learning curves (train loss, eval perplexity, tokens/s) from metrics.jsonl as a PNG."""
    from tfm_jax.viz import curves as plots

    out = plots.plot_learning_curves(args.workdir, args.out)
    print(out)
    return 0


def _setup_logging() -> None:
    """tfm_jax's own progress messages at INFO on stderr; libraries stay at WARNING."""
    logger = logging.getLogger("tfm_jax")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    # Orbax warns each time a checkpoint folder is opened for reading (as `average` does).
    logging.getLogger("absl").addFilter(lambda record: "read only" not in record.getMessage())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _setup_logging()
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

        p = sub.add_parser("average", help="average the last N checkpoints (§6.1)")
        p.add_argument("--workdir", required=True)
        p.add_argument("--config", default=None, help="default: the run's saved config")
        p.add_argument("--last", type=int, default=0, help="default: train.average_last")
        p.set_defaults(fn=cmd_average)

        p = sub.add_parser("plot", help="learning curves from <workdir>/metrics.jsonl (PNG)")
        p.add_argument("--workdir", required=True)
        p.add_argument("--out", default=None, help="default: <workdir>/learning_curves.png")
        p.set_defaults(fn=cmd_plot)

        from tfm_jax.cli import inference as inference_cli  # translate, evaluate, attention

        inference_cli.add_commands(sub)

        args = parser.parse_args(argv)
        paths.resolve_args(args)  # once, here: every command below sees absolute local paths
        return args.fn(args, overrides)
    except config_lib.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if isinstance(e, _user_facing_errors()):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
