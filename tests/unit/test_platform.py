"""The platform seam: the only backend query, what "auto" resolves to on CPU, the compilation
cache, and the CPU-only malloc tunables (added once, beside the user's, optional, CPU only)."""

import os
import re
import subprocess
import sys

import jax
import pytest
from helpers import REPO

from tfm_jax import platform
from tfm_jax.config import defaults as config
from tfm_jax.platform import cpu
from tfm_jax.platform import host as hostenv  # the malloc half of the seam

needs_glibc_tunables = pytest.mark.skipif(
    not hostenv._glibc_has_hugetlb_tunable(), reason="needs glibc >= 2.35 on Linux"
)


@pytest.mark.cpu_only
@needs_glibc_tunables
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


@pytest.mark.cpu_only
@needs_glibc_tunables
def test_malloc_tunables_modes():
    env = hostenv.malloc_env({"TFM_JAX_MALLOC_TUNABLES": "hugepages"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert not hostenv.tunables_active(env)  # glibc's own heap: the resident set is not kept
    assert hostenv.malloc_env(env) is None
    assert hostenv.malloc_env({"TFM_JAX_MALLOC_TUNABLES": "1"})["GLIBC_TUNABLES"] == ":".join(
        hostenv.TUNABLES
    )
    with pytest.raises(SystemExit, match=r"TFM_JAX_MALLOC_TUNABLES='yes'.*hugepages"):
        hostenv.malloc_env({"TFM_JAX_MALLOC_TUNABLES": "yes"})


@pytest.mark.multiprocess
@pytest.mark.cpu_only
@needs_glibc_tunables
def test_reexec_runs_the_new_process_with_the_tunable():
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    child = "import os; print(os.environ['GLIBC_TUNABLES'])"
    code = (
        "from tfm_jax.platform import host as hostenv; "
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


@pytest.mark.cpu_only
@needs_glibc_tunables
def test_accelerator_hosts_get_no_malloc_tunables():
    assert hostenv.has_accelerator({"JAX_PLATFORMS": "cuda"})
    assert hostenv.has_accelerator({"JAX_PLATFORMS": "tpu,cpu"})
    assert not hostenv.has_accelerator({"JAX_PLATFORMS": "cpu"})
    assert hostenv.has_accelerator({"JAX_PLATFORMS": "", "TPU_ACCELERATOR_TYPE": "v5p-8"})
    assert hostenv.malloc_env({"JAX_PLATFORMS": "cuda"}) is None
    assert hostenv.malloc_env({"JAX_PLATFORMS": "cpu"}) is not None


def test_only_the_seam_asks_for_the_backend():
    root = os.path.join(REPO, "tfm_jax")
    offenders = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path == os.path.join(root, "platform", "runtime.py"):
                continue
            with open(path, encoding="utf-8") as f:
                if re.search(r"default_backend\(|jax\.devices\(\)\[0\]\.platform", f.read()):
                    offenders.append(os.path.relpath(path, REPO))
    assert not offenders, f"backend checks outside tfm_jax/platform/runtime.py: {offenders}"


@pytest.mark.cpu_only
def test_auto_resolves_to_the_cpu_paths_on_cpu():
    assert platform.backend() == "cpu"
    assert platform.dropout_prng("auto") == "threefry_fused"
    assert platform.dropout_prng("rbg") == "rbg"
    with pytest.raises(ValueError, match="train.dropout_prng='fast'"):
        platform.dropout_prng("fast")
    assert platform.product_function("auto") is cpu.canonical_product
    assert platform.product_function("einsum") is platform.plain_product
    cfg = config.default_config()
    cfg.platform.compilation_cache = ""
    try:
        cfg.platform.product = "einsum"
        assert platform.init_runtime(cfg).product == "einsum"
    finally:
        cfg.platform.product = "auto"
        assert platform.init_runtime(cfg).product == "cpu_canonical"


def test_compilation_cache_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert platform.default_cache_dir() == str(tmp_path / "xdg" / "tfm_jax" / "xla")
    cfg = config.default_config()
    previous = jax.config.jax_compilation_cache_dir
    try:
        cfg.platform.compilation_cache = str(tmp_path / "cache")
        assert platform.init_runtime(cfg).compilation_cache_dir == str(tmp_path / "cache")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
        cfg.platform.compilation_cache = "auto"
        assert platform.init_runtime(cfg).compilation_cache_dir == platform.default_cache_dir()
        cfg.platform.compilation_cache = ""
        assert platform.init_runtime(cfg).compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)


def test_memory_warning_names_the_limit_and_the_remedy():
    gb = 2**30
    assert hostenv.memory_warning(20 * gb, 24 * gb, tunables=True) is None  # 83%: below 85%
    assert hostenv.memory_warning(20 * gb, None, tunables=True) is None  # limit unknown
    msg = hostenv.memory_warning(21 * gb, 24 * gb, tunables=True)
    assert "21.0 GB is 88% of the 24.0 GB" in msg and "SIGKILL" in msg
    assert "TFM_JAX_MALLOC_TUNABLES=hugepages" in msg
    msg = hostenv.memory_warning(23 * gb, 24 * gb, tunables=False)
    assert "TFM_JAX_MALLOC_TUNABLES" not in msg and "optim.accumulate_steps" in msg
    limit = hostenv.memory_limit_bytes()
    assert limit is None or 2**26 < limit < 2**60


def test_a_child_without_the_heap_tunables_keeps_huge_pages_and_the_users_own():
    ours = ":".join(hostenv.TUNABLES)
    assert hostenv.tunables_active({"GLIBC_TUNABLES": ours})
    assert not hostenv.tunables_active({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    assert hostenv.child_has_tunables({"GLIBC_TUNABLES": ours})  # inherited: no re-exec needed
    assert not hostenv.child_has_tunables({"TFM_JAX_MALLOC_TUNABLES": "0"})
    assert not hostenv.child_has_tunables({"TFM_JAX_MALLOC_TUNABLES": "hugepages"})
    env = hostenv.without_heap_tunables(
        {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=0:" + ours, "A": "b"}
    )
    assert env == {
        "GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=0:glibc.malloc.hugetlb=1",
        "TFM_JAX_MALLOC_TUNABLES": "hugepages",
        "A": "b",
    }
    assert not hostenv.child_has_tunables(env)
    heap = ":".join(hostenv.HEAP_TUNABLES)
    assert "GLIBC_TUNABLES" not in hostenv.without_heap_tunables({"GLIBC_TUNABLES": heap})


ZEN3_CPUINFO = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n"
XEON_CPUINFO = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_cpu_bf16_support_is_read_from_the_cpuinfo_flags():
    assert hostenv.cpu_has_bf16(ZEN3_CPUINFO) is False
    assert hostenv.cpu_has_bf16(XEON_CPUINFO) is True
    assert hostenv.cpu_has_bf16(ARM_CPUINFO) is True
    assert hostenv.cpu_has_bf16("processor\t: 0\n") is None  # no flags line: unknown
    assert hostenv.cpu_has_bf16() in (True, False, None)  # this machine's own file


def test_cpu_model_names_the_processor_and_its_bf16():
    # what decides a CPU run's bits, recorded with each Table 3 result
    assert hostenv.cpu_model(ZEN3_CPUINFO) == "AMD EPYC, no bf16"
    zen4 = "model name\t: AMD EPYC  9R14 96-Core\nflags\t: avx512f avx512_bf16\n"
    assert hostenv.cpu_model(zen4) == "AMD EPYC 9R14 96-Core, bf16"
    assert hostenv.cpu_model(XEON_CPUINFO) is None  # no model name line
    assert hostenv.cpu_model("model name\t: X\n") == "X, bf16 unknown"


def test_bf16_warning_only_for_bf16_on_a_cpu_without_it():
    msg = hostenv.bf16_warning("bfloat16", "cpu", has_bf16=False)
    assert "without bf16 instructions" in msg and "--config.model.dtype=float32" in msg
    assert hostenv.bf16_warning("float32", "cpu", has_bf16=False) is None
    assert hostenv.bf16_warning("bfloat16", "cpu", has_bf16=True) is None
    assert hostenv.bf16_warning("bfloat16", "cpu", has_bf16=None) is None  # unknown: say nothing
    assert hostenv.bf16_warning("bfloat16", "gpu", has_bf16=False) is None


def test_the_malloc_benchmark_runs_each_setting_with_exactly_its_tunables(monkeypatch):
    from experiments import malloc_ab

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=0")
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    for setting, tunables in [("none", ()), ("hugetlb", (hostenv.HUGE_PAGES,)), ("all", None)]:
        env = malloc_ab.env_for(setting)
        got = tuple(t for t in env.get("GLIBC_TUNABLES", "").split(":") if t)
        assert got == (hostenv.TUNABLES if tunables is None else tunables), setting
        assert hostenv.malloc_env(env) is None  # the child re-executes with nothing added
    assert hostenv.tunables_active(malloc_ab.env_for("all"))


def test_reader_gone_is_a_pipe_whose_reading_end_is_closed(tmp_path):
    """What lets the CLI call a BrokenPipeError a closed stdout (exit 141, quiet) and not hide
    another pipe's: only a pipe without readers polls as gone."""
    read, write = os.pipe()
    try:
        assert not hostenv.reader_gone(write)  # read, and the buffer has room
        os.close(read)
        assert hostenv.reader_gone(write)
    finally:
        os.close(write)
    with open(tmp_path / "out.txt", "w") as f:
        assert not hostenv.reader_gone(f.fileno())  # a file never is
    from tfm_jax.cli import errors

    assert errors.report(BrokenPipeError(32, "another pipe")) is None  # stdout is read: a bug


def test_a_broken_pipe_with_a_captured_stdout_is_reraised(capsys):
    from tfm_jax.cli import errors

    assert not hostenv.reader_gone()  # capsys's stdout has no file descriptor
    assert errors.report(BrokenPipeError(32, "another pipe")) is None
