"""Process set-up before JAX starts (no JAX import here): malloc tunables, accelerator detection,
the process's resident memory, and printing to a stdout whose reader may go away.

CPU-only: the malloc tunables. XLA:CPU allocates each execution's temporaries as one block (5.4
GB for a base f32 training step at 4,096 target tokens, 4.4 GB in bf16) and frees it when the
step ends, besides other large buffers. glibc serves allocations over 32 MB, and any allocation
a non-main thread's arena cannot hold, with fresh mmaps and unmaps them on free, so every step
faulted all of that memory in again: 1.66 million page faults per base step on the 2-core
machine, 17% of its CPU time in the kernel. On a host without an accelerator the entry points
re-execute themselves once with these glibc tunables:

- `glibc.malloc.arena_max=1`, `glibc.malloc.mmap_max=0`, `glibc.malloc.trim_threshold=1 TiB`:
  one heap, grown with brk and never handed back, so a freed step's blocks serve the next step
  (0 page faults and ~0 s of kernel time per step after the first). The cost is memory: the
  resident set stays at the run's high-water mark, and one arena fragments more. Measured:
  the base bench process peaks at 7.6 GB (7.0 GB without), but a 40-step small-config `train`
  at 9.2 GB (2.1 GB without; it reaches that in its first steps and stays flat) for 1.35x the
  tokens/s. The growth is not bounded by the step's temporaries: the small Table 3 preset's A32
  row (32 heads of 4; XLA's temporaries 4.1 GB) passed 21 GB in its first 50 steps and was
  killed by the kernel on a 24 GB host, and peaked at 4.9 GB without the tunables, with the same
  losses to the last printed digit. On a small-memory host, use `hugepages` (below). The
  training loop warns once its resident memory passes 85% of what the host (or its cgroup)
  allows (`memory_warning`);
- `glibc.malloc.hugetlb=1` (glibc >= 2.35): the heap is backed by transparent huge pages.

Base f32 step: 13.7 s with none, 10.3 s with huge pages only (1.7 s of kernel time a step),
9.6-10.1 s with all (0.01 s). The same pid, so signals and process managers are unaffected.
GPU and TPU hosts (and any process with JAX_PLATFORMS naming an accelerator) are left alone:
nothing there has been measured to gain from it.

TFM_JAX_MALLOC_TUNABLES chooses (MODES): 1, the default, all of the above; `hugepages`, huge
pages only, which keep glibc's own heap (freed blocks are unmapped, so the resident set is what
it would be without tunables) for most of the speed; 0, none. Measured on the small Table 3
preset (`python -m experiments.malloc_ab`, experiments/results/malloc_ab_20261205.jsonl, the
same losses to the last digit): base 4,797 / 7,007 / 7,405 target tok/s with none / hugepages /
all at a peak of 2.8 / 2.8 / 8.7 GB; A32 2,274 / 3,258 tok/s with none / hugepages, both at
5.0 GB. A command the kernel killed with the heap tunables runs again with `hugepages`. A
tunable already in GLIBC_TUNABLES is left as the user set it.
"""

from __future__ import annotations

import io
import os
import platform
import select
import sys

# The three that keep the heap at its high-water mark (huge pages alone do not).
HEAP_TUNABLES = (
    "glibc.malloc.arena_max=1",
    "glibc.malloc.mmap_max=0",
    f"glibc.malloc.trim_threshold={2**40}",
)
HUGE_PAGES = "glibc.malloc.hugetlb=1"
TUNABLES = (*HEAP_TUNABLES, HUGE_PAGES)
# TFM_JAX_MALLOC_TUNABLES's values: the tunables each one asks for.
MODES = {"1": TUNABLES, "hugepages": (HUGE_PAGES,), "0": ()}


def _glibc_has_hugetlb_tunable() -> bool:
    lib, version = platform.libc_ver()
    if lib != "glibc":
        return False
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 35)


def has_accelerator(environ: dict[str, str] | None = None) -> bool:
    """Whether JAX will find a GPU or TPU here, decided without starting JAX.

    JAX_PLATFORMS, when set, decides (any entry other than "cpu"); otherwise NVIDIA device nodes
    (/dev/nvidia0, /dev/nvidiactl), a TPU chip (/dev/accel0) or a TPU VM's environment
    (TPU_ACCELERATOR_TYPE, TPU_NAME) count as one.
    """
    environ = os.environ if environ is None else environ
    platforms = [p.strip() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if platforms:
        return any(p != "cpu" for p in platforms)
    if any(environ.get(k) for k in ("TPU_ACCELERATOR_TYPE", "TPU_NAME")):
        return True
    return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/accel0"))


def malloc_env(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """The environment with the tunables added, or None if there is nothing to add."""
    environ = dict(os.environ if environ is None else environ)
    mode = environ.get("TFM_JAX_MALLOC_TUNABLES", "1")
    if mode not in MODES:
        raise SystemExit(
            f"TFM_JAX_MALLOC_TUNABLES={mode!r} in the environment: use 1 (the default: huge pages "
            "and a heap kept at its high-water mark, the fastest CPU steps), hugepages (huge "
            "pages only: ~5% slower, much less memory) or 0 (glibc's defaults)"
        )
    if not MODES[mode]:
        return None
    if has_accelerator(environ):
        return None  # CPU hosts only: measured there, unmeasured on GPU/TPU hosts
    if not sys.platform.startswith("linux") or not _glibc_has_hugetlb_tunable():
        return None
    current = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
    names = {t.split("=")[0] for t in current}
    missing = [t for t in MODES[mode] if t.split("=")[0] not in names]
    if not missing:
        return None
    environ["GLIBC_TUNABLES"] = ":".join(current + missing)
    return environ


def reexec_with_malloc_tunables(argv: list[str]) -> None:
    """Re-executes `python *argv` with the tunables set; returns only if nothing is to be done.

    argv: what follows the interpreter, e.g. ["-m", "tfm_jax", *sys.argv[1:]].
    """
    env = malloc_env()
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *argv], env)


def resident_bytes() -> tuple[int, int]:
    """(current, peak) resident memory of this process in bytes; current is 0 where unknown.

    Logged with training progress: with the malloc tunables above the process keeps its
    high-water mark, so the peak is what a host must have.
    """
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        current = 0
    return current, max(peak, current)  # the kernel updates its high-water mark lazily


# The share of the host's memory at which the training loop warns (once) that the kernel may
# kill it: a SIGKILL leaves no traceback, so the log must say why beforehand.
MEMORY_WARN_FRACTION = 0.85


def memory_limit_bytes() -> int | None:
    """The most memory this process may hold: the host's physical memory, or its cgroup's limit
    when that is lower (a container); None where neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 2**60:  # "max" or a huge number: no limit
            limits.append(int(text))
    return min(limits) if limits else None


def tunables_active(environ: dict[str, str] | None = None) -> bool:
    """Whether this process runs with the tunables that keep the heap's high-water mark."""
    environ = os.environ if environ is None else environ
    current = set(environ.get("GLIBC_TUNABLES", "").split(":"))
    return all(t in current for t in HEAP_TUNABLES)


def child_has_tunables(environ: dict[str, str]) -> bool:
    """Whether a `python -m tfm_jax` started with this environment runs with the heap tunables."""
    return tunables_active(malloc_env(environ) or environ)


def without_heap_tunables(environ: dict[str, str]) -> dict[str, str]:
    """The environment for a child that must run with a smaller heap: huge pages only (the
    heap's tunables removed from GLIBC_TUNABLES, the user's others kept)."""
    env = dict(environ, TFM_JAX_MALLOC_TUNABLES="hugepages")
    kept = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t not in HEAP_TUNABLES]
    if kept:
        env["GLIBC_TUNABLES"] = ":".join(kept)
    else:
        env.pop("GLIBC_TUNABLES", None)
    return env


def memory_warning(rss: int, limit: int | None, tunables: bool) -> str | None:
    """The warning to log when resident memory `rss` nears `limit` (bytes), or None."""
    if not limit or rss < MEMORY_WARN_FRACTION * limit:
        return None
    msg = (
        f"resident memory {rss / 2**30:.1f} GB is {rss / limit:.0%} of the {limit / 2**30:.1f} GB "
        "this process may use: the kernel may kill it (SIGKILL, no traceback). "
    )
    if tunables:
        return msg + (
            "The malloc tunables keep the heap at its high-water mark (tfm_jax/platform/host.py); "
            "if it is killed, resume it with TFM_JAX_MALLOC_TUNABLES=hugepages in the "
            "environment (~5% slower steps on CPU, often a fraction of the memory, the same "
            "numbers)"
        )
    return msg + (
        "For less memory at the same tokens an update, start a new run with data.tokens_per_batch "
        "halved and optim.accumulate_steps and train.num_steps (which counts micro-batches) doubled"
    )


# CPU flags of instructions that multiply bf16 natively (x86: AVX512-BF16, AMX; Arm: BF16).
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def _read_cpuinfo(cpuinfo: str | None) -> str | None:
    if cpuinfo is not None:
        return cpuinfo
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def cpu_has_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU multiplies bf16 in hardware, from /proc/cpuinfo's flags; None: unknown.

    cpuinfo: the file's text (tests pass their own); None reads /proc/cpuinfo.
    """
    flags: set[str] = set()
    for line in (_read_cpuinfo(cpuinfo) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):  # x86 "flags", Arm "Features"
            flags.update(value.split())
    if not flags:
        return None
    return bool(flags & BF16_CPU_FLAGS)


def cpu_model(cpuinfo: str | None = None) -> str | None:
    """The processor's name and whether it has bf16 arithmetic ("AMD EPYC 9R14, bf16"), the two
    things that decide a CPU run's bits; None where /proc/cpuinfo names no model."""
    text = _read_cpuinfo(cpuinfo) or ""  # read once, for the name and the flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "model name" and value.strip():
            bf16 = {True: "bf16", False: "no bf16", None: "bf16 unknown"}[cpu_has_bf16(text)]
            return f"{' '.join(value.split())}, {bf16}"
    return None


def bf16_warning(dtype: str, backend: str, has_bf16: bool | None) -> str | None:
    """The warning to log when bf16 compute is asked for on a CPU that has no bf16 instructions.

    A warning, not a switch: changing the dtype by platform would change a run's numbers.
    """
    if backend != "cpu" or has_bf16 is not False or dtype != "bfloat16":
        return None
    return (
        f"model.dtype={dtype} on a CPU without bf16 instructions (no avx512_bf16 / amx_bf16 in "
        "/proc/cpuinfo): XLA:CPU emulates the bf16 dots, so this is likely slower than float32 "
        "(measured on a 2-core Zen 3: the small config's step 2.80 s in bf16, 2.18 s in f32, "
        "experiments/results/bench.md). For speed here, pass --config.model.dtype=float32 "
        "(a new run: its numbers differ slightly from bf16's)"
    )


def print_stdout(line: str) -> bool:
    """Prints `line` on stdout, flushed. Where stdout's reader has gone (`| head`, a harness
    that was killed), stdout is pointed at /dev/null and False returned, where Python raises:
    a line nobody reads must not crash a run in the middle of its work (the training loop
    stops it with that step saved; its result line is only lost)."""
    try:
        print(line, flush=True)
        return True
    except BrokenPipeError:
        silence_stdout()
        return False


def reader_gone(fd: int | None = None) -> bool:
    """Whether `fd` (default: stdout's) is a pipe or socket whose reading end is closed: what a
    BrokenPipeError from writing it means, and nothing else does (Linux's poll reports POLLERR
    for it). False for a stdout that is no file (a test's capture)."""
    if fd is None:
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, ValueError, io.UnsupportedOperation):
            return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def silence_stdout() -> None:
    """Points stdout at /dev/null, so that writing or flushing it (at exit too) cannot raise."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
