"""Config building for the command line: a `--config` file (or a run's saved config) plus typed
`--config.a.b=value` overrides, paths resolved, validated and locked. Every command and
experiments/ script builds its config here."""

from __future__ import annotations

from tfm_jax.config import core as config_lib
from tfm_jax.config import paths


def split_overrides(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Pulls `--config.a.b=v` (or `--config.a.b v`) out of argv; returns (rest, {"a.b": "v"})."""
    rest, overrides = [], {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--config."):
            key, eq, value = arg[len("--config.") :].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise config_lib.ConfigError(f"{arg} needs a value: {arg}=VALUE")
                value = argv[i + 1]
                i += 1
            overrides[key] = value
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def build_config(spec: str | None, overrides: dict[str, str], workdir: str | None = None):
    """--config file (or the workdir's saved config) + typed overrides, validated and locked."""
    if spec:
        cfg = config_lib.load_config_file(spec)
    elif workdir:
        from tfm_jax.checkpoint import manager as checkpoint  # only for a run's saved config

        cfg = config_lib.config_from_json(checkpoint.read_config_json(workdir))
    else:
        raise config_lib.ConfigError("give --config=configs/<file>.py (or --workdir of a run)")
    for key, text in overrides.items():
        config_lib.apply_overrides(cfg, {key: config_lib.parse_override_value(cfg, key, text)})
    paths.resolve_config_paths(cfg)
    cfg.lock()
    config_lib.validate(cfg)
    return cfg
