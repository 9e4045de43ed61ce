"""hostenv: the malloc tunables are added once, beside (never over) the user's, and optional."""

import os
import subprocess
import sys

import pytest
from conftest import REPO

from tfm_jax import hostenv

pytestmark = pytest.mark.skipif(
    not hostenv._glibc_has_hugetlb_tunable(), reason="needs glibc >= 2.35 on Linux"
)


def test_malloc_env_adds_the_tunables_once():
    ours = ":".join(hostenv.TUNABLES)
    assert hostenv.malloc_env({})["GLIBC_TUNABLES"] == ours
    assert "glibc.malloc.hugetlb=1" in ours and "glibc.malloc.mmap_max=0" in ours
    env = hostenv.malloc_env({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=0", "A": "b"})
    assert env["GLIBC_TUNABLES"] == "glibc.rtld.optional_static_tls=0:" + ours
    assert env["A"] == "b"
    assert hostenv.malloc_env(env) is None  # already there: no second re-exec
    # A tunable the user set keeps the user's value; only the others are added.
    env = hostenv.malloc_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    tunables = env["GLIBC_TUNABLES"].split(":")
    assert tunables[0] == "glibc.malloc.arena_max=4" and len(tunables) == len(hostenv.TUNABLES)
    assert hostenv.malloc_env({"TFM_JAX_MALLOC_TUNABLES": "0"}) is None


def test_reexec_runs_the_new_process_with_the_tunable():
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    child = "import os; print(os.environ['GLIBC_TUNABLES'])"
    code = (
        "from tfm_jax import hostenv; "
        f"hostenv.reexec_with_malloc_tunables(['-c', {child!r}]); print('not re-executed')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.stdout == ":".join(hostenv.TUNABLES) + "\n", (out.stdout, out.stderr[-500:])
    # With the tunable already set (a child of a re-executed process) nothing happens.
    env["GLIBC_TUNABLES"] = ":".join(hostenv.TUNABLES)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.stdout == "not re-executed\n"
