"""Config building: a `--config` file (or a run's saved config) plus typed `--config.a.b=value`
overrides, paths resolved, validated and locked, for every command and experiment (experiments/).

The override parsing (split_overrides, parse_override_value, apply_overrides) and the loading of
config files (load_config_module, load_config_file) live here and nowhere else.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import re
import sys
import types

import ml_collections

from tfm_jax.config import paths
from tfm_jax.config.defaults import config_from_json
from tfm_jax.config.validate import ConfigError, validate


def apply_overrides(cfg: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
    """Sets dotted keys ({"model.d_k": 16}) on a config; unknown keys name the closest valid one."""
    for dotted, value in overrides.items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for i, name in enumerate(parents + [leaf]):
            keys = list(node.keys())
            if name not in keys:
                where = ".".join(parents[:i]) or "<top level>"
                close = difflib.get_close_matches(name, keys, n=1)
                hint = f' Did you mean "{".".join(parents[:i] + close)}"?' if close else ""
                raise ConfigError(
                    f'unknown config key "{dotted}": "{name}" is not in {where} '
                    f"(valid: {', '.join(sorted(keys))}).{hint}"
                )
            if i < len(parents):
                node = node[name]
        try:
            node[leaf] = value  # existing keys stay settable on a locked config
        except TypeError as e:
            raise ConfigError(f"config key {dotted}: {e}") from None
    return cfg


def parse_override_value(cfg: ml_collections.ConfigDict, dotted: str, text: str):
    """Command-line text -> a value of the type the config field already has."""
    node = cfg
    *parents, leaf = dotted.split(".")
    try:
        for name in parents:
            node = node[name]
        kind = node.get_type(leaf)
    except (KeyError, AttributeError):
        apply_overrides(cfg.copy_and_resolve_references(), {dotted: None})  # raises, with a hint
        raise
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        if kind in (int, float):
            return kind(float(text)) if kind is int and "e" in text.lower() else kind(text)
        if kind in (tuple, list, dict):
            return kind(ast.literal_eval(text))
        return text
    except (ValueError, SyntaxError, TypeError):  # TypeError: tuple(5) for "5"
        raise ConfigError(
            f"--config.{dotted}={text!r}: expected a {kind.__name__} like the default"
        ) from None


def load_config_module(path: str, typed: str | None = None) -> types.ModuleType:
    """Executes a config file (configs/*.py) as a module and returns it.

    Config files load each other through this (configs/big.py takes the "big" row of
    configs/table3.py), by a path relative to their own `__file__`. `typed` is the `--config`
    text, for the error message.
    """
    if not os.path.exists(path):
        raise ConfigError(
            f"config file {path!r} does not exist" + (f" (from --config={typed})" if typed else "")
        )
    name = "_tfm_jax_config_" + re.sub(r"\W", "_", os.path.abspath(path))
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses (and pickle) look a class's module up by name
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """Loads `path/to/file.py[:arg]` by calling its get_config([arg]), as config_flags does."""
    path, _, arg = spec.partition(":")
    module = load_config_module(path, typed=spec)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path} defines no get_config() function")
    return module.get_config(arg) if arg else module.get_config()


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
                    raise ConfigError(f"{arg} needs a value: {arg}=VALUE")
                value = argv[i + 1]
                i += 1
            overrides[key] = value
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def build_config(spec: str | None, overrides: dict[str, str], saved: dict | None = None):
    """--config file (or `saved`, the config a run saved: checkpoint.reading.read_config_json)
    + typed overrides, validated and locked."""
    if spec:
        cfg = load_config_file(spec)
    elif saved is not None:
        cfg = config_from_json(saved)
    else:
        raise ConfigError("give --config=configs/<file>.py (or --workdir of a run)")
    for key, text in overrides.items():
        apply_overrides(cfg, {key: parse_override_value(cfg, key, text)})
    paths.resolve_config_paths(cfg)
    cfg.lock()
    validate(cfg)
    return cfg
