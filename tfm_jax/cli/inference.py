"""The `translate`, `evaluate` and `attention` commands: argument parsing, one-line user errors
and the calls into decode/, eval/ and viz/attention.py, which know nothing of the CLI."""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from typing import Any

import ml_collections

from tfm_jax import platform
from tfm_jax.checkpoint import reading
from tfm_jax.cli import errors
from tfm_jax.cli.log_setup import setup_logging
from tfm_jax.config import paths
from tfm_jax.config.build import build_config
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.decode.load import (
    InferenceError,
    check_workdir,
    default_checkpoint,
    load_ensemble,
    load_for_inference,
)
from tfm_jax.decode.translate import translate_texts
from tfm_jax.eval.evaluate import evaluate_split
from tfm_jax.model.transformer import Transformer
from tfm_jax.platform import cpu, storage


def _cli(fn):
    """Prints a user error as one line on stderr (exit 1; config errors 2) instead of a trace.

    Also sets up logging as cli/main.py's main does (idempotent), so the commands log the same
    however they are reached (`python -m tfm_jax`, or a test that calls them directly)."""

    @functools.wraps(fn)
    def wrapper(args, overrides: dict[str, str]) -> int:
        setup_logging()
        if args.cpu_devices is not None and args.cpu_devices < 1:
            print(f"error: --cpu_devices={args.cpu_devices}; give a count >= 1", file=sys.stderr)
            return 1
        platform.split_cpu_devices(args.cpu_devices)  # before JAX starts
        try:
            return fn(args, overrides)
        except Exception as e:
            code = errors.report(e)
            if code is None:
                raise
            return code

    return wrapper


def _config(args, overrides) -> ml_collections.ConfigDict:
    """--config (or the run's saved config) with the overrides, its platform settings applied."""
    check_workdir(args.workdir)
    # A missing checkpoint is a CheckpointNotFoundError listing what the workdir holds.
    # warn=False: loading the params then warns once about a checkpoint that does not read
    saved = None if args.config else reading.read_config_json(args.workdir, warn=False)
    cfg = build_config(args.config, dict(overrides), saved)
    platform.init_runtime(cfg)  # the run's platform settings
    return cfg


def _setup(args, overrides) -> tuple[ml_collections.ConfigDict, Transformer, Any, Tokenizer, str]:
    cfg = _config(args, overrides)
    which = args.checkpoint or default_checkpoint(args.workdir)
    model, params, tokenizer = load_for_inference(args.workdir, which, cfg)
    return cfg, model, params, tokenizer, which


def _setup_ensemble(args, overrides):
    """_setup, plus the runs of --ensemble (each from the config it saved; the same --checkpoint,
    or each one's default): (cfg, models, params, tokenizer, which, members). Without
    --ensemble, model and params are the one run's and members is empty."""
    others = [paths.resolve(w) for w in args.ensemble or []]
    if not others:
        return (*_setup(args, overrides), [])
    cfg = _config(args, overrides)
    for workdir in others:
        check_workdir(workdir)
    workdirs = [args.workdir, *others]
    # The overrides are the first run's (they set decoding and data); every other member is
    # built from its own saved config, so members of different shapes load as they were trained.
    cfgs = [cfg] + [build_config(None, {}, reading.read_config_json(w)) for w in others]
    which = [args.checkpoint or default_checkpoint(w) for w in workdirs]
    models, params, tokenizer = load_ensemble(workdirs, which, cfgs)
    members = [{"workdir": w, "checkpoint": str(c)} for w, c in zip(workdirs, which, strict=True)]
    return cfg, models, params, tokenizer, which[0], members


def _ensemble_out_dir(workdir: str, members: list[dict]) -> str:
    """<workdir>/eval/ensemble<N>_<hash of the members>: one folder per distinct ensemble."""
    key = json.dumps(members, sort_keys=True).encode()
    return storage.join(
        workdir, "eval", f"ensemble{len(members)}_{hashlib.sha256(key).hexdigest()[:8]}"
    )


def _read_lines(path: str | None) -> list[str]:
    if path and not storage.isfile(path):
        raise InferenceError(f"input file {path!r} does not exist")
    if path:
        text = storage.read_text(path)
    else:
        text = sys.stdin.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it is not an empty line
    return lines


@_cli
def cmd_translate(args, overrides: dict[str, str]) -> int:
    """Translates lines of --input (or stdin) to --output (or stdout), in order."""
    if args.input and not storage.isfile(args.input):
        raise InferenceError(f"input file {args.input!r} does not exist")
    cfg, model, params, tokenizer, _, _ = _setup_ensemble(args, overrides)
    lines = _read_lines(args.input)
    hyps = translate_texts(cfg, model, params, tokenizer, lines, greedy=args.greedy)
    text = "".join(h + "\n" for h in hyps)
    if args.output:
        storage.write_text(args.output, text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


def _parse_floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InferenceError(f"--alphas={text!r}: expected comma-separated numbers") from None


@_cli
def cmd_evaluate(args, overrides: dict[str, str]) -> int:
    """BLEU, chrF, tokenized BLEU and perplexity on a split; scores.json, JSON printed last."""
    cfg, model, params, tokenizer, which, members = _setup_ensemble(args, overrides)
    alphas = _parse_floats(args.alphas) if args.alphas else None
    out_dir = args.out or (_ensemble_out_dir(args.workdir, members) if members else None)
    scores = evaluate_split(
        cfg,
        model,
        params,
        tokenizer,
        args.split,
        workdir=args.workdir,
        alphas=alphas,
        out_dir=out_dir,
        checkpoint_name=which,
        greedy=args.greedy,
        members=members,
    )
    print(json.dumps(scores))
    return 0


@_cli
def cmd_attention(args, overrides: dict[str, str]) -> int:
    """PNG heatmaps of encoder self-, decoder self- and encoder-decoder attention."""
    # here, not at the top: every command's parser imports this module, and matplotlib's import
    # (~0.35 s) is this command's alone
    from tfm_jax.viz import attention as attention_plot

    cfg, model, params, tokenizer, _ = _setup(args, overrides)
    out_dir = args.out or storage.join(args.workdir, "attention")
    files = attention_plot.plot_sentence(
        cfg,
        model,
        params,
        tokenizer,
        args.text,
        out_dir=out_dir,
        layers=attention_plot.parse_indices(args.layers, cfg.model.num_layers, "--layers"),
        heads=attention_plot.parse_indices(args.heads, cfg.model.num_heads, "--heads"),
    )
    print(json.dumps({"files": files}))
    return 0


def add_commands(subparsers) -> None:
    """Registers `translate`, `evaluate` and `attention` on an argparse subparsers object."""

    def common(p):
        p.add_argument("--workdir", required=True, help="a training run's directory")
        p.add_argument("--config", default=None, help="default: the config the run saved")
        p.add_argument(
            "--checkpoint",
            default=None,
            help='"averaged", "latest" or a step (default: averaged if it exists, else latest)',
        )
        p.add_argument(
            "--cpu_devices",
            type=int,
            default=None,
            help="CPU hosts: decode this many batches at once, one per JAX CPU device "
            f"(default: one per core, at most {cpu.MAX_AUTO_CPU_DEVICES}; 1 = one device)",
        )

    def ensemble(p):
        p.add_argument(
            "--ensemble",
            action="append",
            metavar="WORKDIR",
            help="another run to decode with, averaging the runs' next-token probabilities "
            "(repeat for more; same vocabulary; same --checkpoint, or each one's default)",
        )

    p = subparsers.add_parser("translate", help="translate lines of text (stdin -> stdout)")
    common(p)
    ensemble(p)
    p.add_argument("--input", default=None, help="text file, one sentence a line (default stdin)")
    p.add_argument("--output", default=None, help="default stdout")
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of beam search")
    p.set_defaults(fn=cmd_translate)

    p = subparsers.add_parser("evaluate", help="BLEU / chrF / perplexity of a split")
    common(p)
    ensemble(p)
    p.add_argument(
        "--split", required=True, help='"validation", "test" (the config\'s) or a split name'
    )
    p.add_argument("--alphas", default=None, help="comma-separated length penalties to compare")
    p.add_argument(
        "--out",
        default=None,
        help="default <workdir>/eval/<checkpoint> (an ensemble: <workdir>/eval/ensemble<N>_<id>)",
    )
    p.add_argument("--greedy", action="store_true")
    p.set_defaults(fn=cmd_evaluate)

    p = subparsers.add_parser("attention", help="attention heatmaps for one sentence")
    common(p)
    p.add_argument("--text", required=True, help="the source sentence")
    p.add_argument("--layers", default="0,-1", help='layer indices ("0,-1") or "all"')
    p.add_argument("--heads", default="all", help='head indices ("0,1") or "all"')
    p.add_argument("--out", default=None, help="default <workdir>/attention")
    p.set_defaults(fn=cmd_attention)
