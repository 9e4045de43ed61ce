"""hostenv: the malloc huge-page tunable is added once, kept with other tunables, and optional."""

import os
import subprocess
import sys

import pytest
from conftest import REPO

from tfm_jax import hostenv

pytestmark = pytest.mark.skipif(
    not hostenv._glibc_has_hugetlb_tunable(), reason="needs glibc >= 2.35 on Linux"
)


def test_malloc_env_adds_the_tunable_once():
    assert hostenv.malloc_env({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    env = hostenv.malloc_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "A": "b"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert env["A"] == "b"
    assert hostenv.malloc_env(env) is None  # already there: no second re-exec
    assert hostenv.malloc_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None  # user's
    assert hostenv.malloc_env({"TFM_JAX_MALLOC_HUGEPAGES": "0"}) is None


def test_reexec_runs_the_new_process_with_the_tunable():
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    child = "import os; print(os.environ['GLIBC_TUNABLES'])"
    code = (
        "from tfm_jax import hostenv; "
        f"hostenv.reexec_with_malloc_hugepages(['-c', {child!r}]); print('not re-executed')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.stdout == "glibc.malloc.hugetlb=1\n", (out.stdout, out.stderr[-500:])
    # With the tunable already set (a child of a re-executed process) nothing happens.
    env["GLIBC_TUNABLES"] = hostenv.TUNABLE
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.stdout == "not re-executed\n"
