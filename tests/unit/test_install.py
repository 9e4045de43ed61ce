"""The install: constraints.txt pins every declared package inside setup.cfg's ranges, and
setup.cfg declares exactly what the code imports (no undeclared import, no unused dependency)."""

import ast
import configparser
import functools
import importlib.metadata
import os
import re
import sys

import pytest
from helpers import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

# Declared in install_requires but never imported, each with why it is needed anyway.
RUNTIME_ONLY = {
    # data.source=tfds reads array_record files through tensorflow-datasets, which declares
    # array_record for Linux only.
    "array-record",
}
# Declared in the test extra but never imported: tools that CI runs as commands.
TEST_TOOLS = {
    "ruff",  # .ci/run: ruff check
    "pytest-xdist",  # a pytest plugin: setup.cfg's addopts (-n auto)
}
# The repo's own folders beside tfm_jax: tests/ (its helpers package) and experiments/ (a
# package: tests import it as `experiments`).
LOCAL_DIRS = ("tests", "experiments")

_PIN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")


def _setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    return cfg


def _requirements(text):
    return [Requirement(line) for line in text.splitlines() if line.strip()]


def declared_install_requires():
    return _requirements(_setup_cfg()["options"]["install_requires"])


def declared_test_extra(extra: str = "test"):
    return _requirements(_setup_cfg()["options.extras_require"][extra])


def constraint_lines():
    with open(os.path.join(REPO, "constraints.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return [line for line in lines if line and not line.startswith("#")]


def pins():
    out = {}
    for line in constraint_lines():
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", line
        out[canonicalize_name(req.name)] = Version(spec.version)
    return out


def imported_modules(folder):
    """{top-level module: first file importing it} for every import in folder's .py files, those
    inside functions included; stdlib and relative imports left out."""
    found = {}
    for root, _, files in os.walk(os.path.join(REPO, folder)):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    mods = [node.module]
                else:
                    continue
                for mod in mods:
                    top = mod.split(".")[0]
                    if top not in sys.stdlib_module_names:
                        found.setdefault(top, os.path.relpath(path, REPO))
    return found


def _local_modules():
    """Modules and packages of the repo's own folders (tests/helpers is a package), and the
    folders that are packages themselves (experiments)."""
    found = {d for d in LOCAL_DIRS if os.path.isfile(os.path.join(REPO, d, "__init__.py"))}
    for d in LOCAL_DIRS:
        for n in os.listdir(os.path.join(REPO, d)):
            if n.endswith(".py"):
                found.add(n[:-3])
            elif os.path.isfile(os.path.join(REPO, d, n, "__init__.py")):
                found.add(n)
    return found


@functools.cache
def _packages_distributions():
    return importlib.metadata.packages_distributions()


def distributions_of(module):
    return {canonicalize_name(d) for d in _packages_distributions().get(module, [])}


def _names(reqs):
    return {canonicalize_name(r.name) for r in reqs}


def test_every_constraint_line_is_an_exact_pin():
    lines = constraint_lines()
    assert lines
    bad = [line for line in lines if not _PIN.match(line)]
    assert not bad, f"constraints.txt lines that are not name==version: {bad}"
    names = [canonicalize_name(Requirement(line).name) for line in lines]
    dups = sorted({n for n in names if names.count(n) > 1})
    assert not dups, f"pinned twice: {dups}"
    for line in lines:
        Version(line.split("==")[1])  # a valid PEP 440 version


def test_constraints_do_not_pin_the_project_or_the_installer():
    project = canonicalize_name(_setup_cfg()["metadata"]["name"])
    pinned = pins()
    assert project not in pinned
    assert not {"pip", "setuptools", "wheel"} & set(pinned)


# the compile extras too: CI installs them (tests/integration/test_compile.py)
@pytest.mark.parametrize("extra", ["install_requires", "test", "tpu", "cuda12-compile", "gcs"])
def test_every_declared_requirement_is_pinned_inside_its_range(extra):
    if extra == "install_requires":
        reqs = declared_install_requires()
    else:
        reqs = declared_test_extra(extra)
    pinned = pins()
    for req in reqs:
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req} is not pinned in constraints.txt (rerun `bash .ci/lock`)"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {name}=={pinned[name]}, outside setup.cfg's {req}"
        )


def test_ci_installs_with_the_lock():
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        installs = [line for line in f if "pip install" in line and ".[test" in line]
    assert installs and all("-c constraints.txt" in line for line in installs), installs


def test_everything_imported_is_declared():
    runtime = _names(declared_install_requires())
    everything = runtime | _names(declared_test_extra())
    # The package itself may import only install_requires, and the gcs extra's clients (only
    # inside the functions a gs:// path reaches: storage.py checks for them and names the
    # extra); tests, experiments and configs may also use the test extra.
    package = runtime | _names(declared_test_extra("gcs"))
    checks = [("tfm_jax", package, set()), ("configs", runtime, set())]
    checks += [(d, everything, _local_modules()) for d in LOCAL_DIRS]
    for folder, declared, local in checks:
        for module, where in sorted(imported_modules(folder).items()):
            if module == "tfm_jax" or module in local:
                continue
            dists = distributions_of(module)
            assert dists, f"{where} imports {module!r}, which no installed distribution provides"
            assert dists & declared, (
                f"{where} imports {module!r} (from {sorted(dists)}), which setup.cfg does not "
                f"declare{' in install_requires' if declared is runtime else ''}"
            )


def test_nothing_declared_is_unused():
    def used_by(folders):
        out = set()
        for folder in folders:
            for module in imported_modules(folder):
                out |= distributions_of(module)
        return out

    runtime = _names(declared_install_requires())
    assert RUNTIME_ONLY <= runtime, "RUNTIME_ONLY names a package setup.cfg no longer declares"
    unused = runtime - used_by(["tfm_jax"]) - RUNTIME_ONLY
    assert not unused, f"declared in install_requires, never imported by tfm_jax/: {unused}"

    test = _names(declared_test_extra())
    assert TEST_TOOLS <= test, "TEST_TOOLS names a package the test extra no longer declares"
    # the test extra also serves experiments/ (test_everything_imported_is_declared)
    unused = test - used_by(["tests", "experiments"]) - TEST_TOOLS
    assert not unused, (
        f"declared in the test extra, never imported by tests/ or experiments/: {unused}"
    )
