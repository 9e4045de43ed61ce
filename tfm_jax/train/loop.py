"""The training loop: setup, the step loop, periodic evaluation, checkpoints and metrics.

Apart from trainer.py (the pure step functions) so that each part can be tested on its own:
`setup_run` builds everything from a config, `train_loop` only iterates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import math
import os
import threading
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from tfm_jax import data, platform
from tfm_jax.checkpoint.manager import Checkpointer, resume_text
from tfm_jax.config import paths
from tfm_jax.model import losses, sharding
from tfm_jax.model.scoring import perplexity
from tfm_jax.platform import cluster, host, lease, notices, report, storage
from tfm_jax.train import preemption, resume
from tfm_jax.train.profile import Profiler
from tfm_jax.train.reporting import LogWindow, MetricsWriter, Progress
from tfm_jax.train.trainer import CompiledStep, Trainer, TrainState, make_trainer

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/Inf loss; nothing past the last good checkpoint was saved."""


@dataclasses.dataclass
class Run:
    """Everything one training run holds, built once by setup_run."""

    cfg: ml_collections.ConfigDict
    workdir: str
    trainer: Trainer
    tokenizer: data.Tokenizer
    train_iter: data.TrainIterator
    eval_batches: list
    checkpointer: Checkpointer
    state: TrainState
    start_step: int
    lease: lease.WorkdirLease | None = None  # process 0's hold on the workdir


def pin_vocabulary(cfg: ml_collections.ConfigDict, tokenizer: data.Tokenizer):
    """Records the vocabulary file in the config so evaluate/translate reuse exactly it."""
    if tokenizer.vocab_size != cfg.model.vocab_size:
        raise data.DataError(
            f"the vocabulary has {tokenizer.vocab_size} pieces but model.vocab_size="
            f"{cfg.model.vocab_size}: set --config.model.vocab_size={tokenizer.vocab_size} or "
            "point data.vocab_path at a vocabulary of the right size"
        )
    if not cfg.data.vocab_path and tokenizer.path:
        cfg.data.vocab_path = paths.resolve(tokenizer.path)  # a gs:// URL stays one
    return cfg


def log_platform(cfg: ml_collections.ConfigDict, trainer: Trainer) -> None:
    """The run's first lines: backend, processes, devices, mesh, dtype (native or not) and each
    device's memory; then a warning for accelerators this node's processes leave idle, and for
    bf16 on a CPU that emulates it."""
    backend, local = platform.backend(), jax.local_devices()
    native = report.bf16_native(backend, local[0], host.cpu_has_bf16())
    for line in report.run_header(
        backend=backend,
        device_kind=local[0].device_kind,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        global_devices=jax.device_count(),
        local_devices=len(local),
        mesh_shape=dict(trainer.mesh.shape),
        dtype=cfg.model.dtype,
        native=native,
        memory=report.device_memory(local),
        host_memory_bytes=host.memory_limit_bytes(),
    ):
        log.info("%s", line)
    idle = cluster.layout_warning(backend, len(local), *cluster.node_layout())
    if idle:
        log.warning("%s", idle)
    slow_bf16 = host.bf16_warning(cfg.model.dtype, backend, native)
    if slow_bf16:
        log.warning("%s", slow_bf16)


def setup_run(cfg: ml_collections.ConfigDict, workdir: str) -> Run:
    """Vocabulary, mesh, model, data iterators and the (restored or fresh) train state.

    A workdir that already has checkpoints is first checked against `cfg` (resume.py): keys that
    change the saved shapes are an error before anything is restored.
    """
    storage.makedirs(workdir)
    resume.check_resume_config(cfg, workdir)
    if cfg.train.keep_checkpoints < cfg.train.average_last:
        log.warning(
            "train.keep_checkpoints=%d < train.average_last=%d: `average` will find only %d "
            "checkpoints (pass it --last, or keep more)",
            cfg.train.keep_checkpoints,
            cfg.train.average_last,
            cfg.train.keep_checkpoints,
        )
    tokenizer = data.get_tokenizer(cfg.data, workdir)
    cfg = pin_vocabulary(cfg, tokenizer)
    trainer = make_trainer(cfg)
    if jax.process_index() == 0:
        log_platform(cfg, trainer)
    dp = sharding.data_parallel_size(trainer.mesh)
    if dp % jax.process_count():
        raise ValueError(f"mesh.data={dp} must be a multiple of the {jax.process_count()} hosts")
    shard = dict(
        batch_multiple=dp // jax.process_count(),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    train_iter = data.make_train_iterator(cfg.data, tokenizer, seed=cfg.train.seed, **shard)
    eval_batches = data.make_eval_batches(cfg.data, tokenizer, cfg.data.eval_split, **shard)
    _all_hosts_set_up()
    ckpt = Checkpointer(
        workdir,
        every_steps=cfg.train.checkpoint_every_steps,
        every_secs=cfg.train.checkpoint_every_secs,
        keep=cfg.train.keep_checkpoints,
        keep_period=cfg.train.keep_checkpoint_period,
    )
    try:
        restored = ckpt.restore_latest(trainer.abstract_state)
        if restored is None:
            state, start = trainer.init_state(cfg.train.seed), 0
            log.info("Starting from scratch in %s", workdir)
        else:
            state, data_state, start = restored
            train_iter.set_state(data_state)
            log.info("Resumed from step %d in %s", start, workdir)
        if jax.process_index() == 0:
            storage.write_text(
                storage.join(workdir, "config.json"), cfg.to_json_best_effort(indent=2)
            )
    except BaseException:
        ckpt.close()  # Orbax's threads must stop before the interpreter does
        raise
    return Run(cfg, workdir, trainer, tokenizer, train_iter, eval_batches, ckpt, state, start)


def _all_hosts_set_up() -> None:
    """Waits until every host has its vocabulary, data and model, before the first collective
    (Orbax's, in Checkpointer): a host that failed before it (no data folder, a full disk) left
    the others waiting there until JAX's shutdown barrier aborted them all (309 s, two hosts);
    now its error, left by the CLI (platform/notices.py), stops them here at once."""
    if jax.process_count() == 1:
        return
    failed = notices.wait_for_all("set up", jax.process_count())
    if failed is not None:
        raise notices.AnotherProcessFailed(
            f"process {jax.process_index()} stopped before training: {failed}"
        )


def _stop_for_another(run: Run, note: str) -> None:
    """Ends this process, blocked in a train step's collective that a failed process will never
    join (notices.watching, in its thread): one line on stderr, then JAX's shutdown, where the
    failed process waits for the others (without it, it waited there 300 s and both aborted)."""
    try:
        newest = run.checkpointer.latest_step()
    except Exception:  # noqa: BLE001 - the message must still be said
        newest = None
    line = f"error: process {jax.process_index()} stopped training: {note}. "
    os.write(2, (line + resume_text(newest, full=False) + "\n").encode())
    # at most a minute: a shutdown barrier that some other stuck process never reaches must not
    # keep this one (JAX's heartbeat check then ends the ones left)
    shutdown = threading.Thread(target=jax.distributed.shutdown, daemon=True)
    shutdown.start()
    shutdown.join(60)
    os._exit(1)


def compile_for_shape(
    trainer: Trainer, state: TrainState, batch, shape: tuple, step: int, writer: MetricsWriter
) -> CompiledStep:
    """Lowers and compiles the train step for a batch shape the run has not seen yet.

    Compilation is explicit (not the jitted step's first call) so that its cost is a number in
    the log and in metrics.jsonl: `{"kind": "compile", "step": the first step of this shape,
    "shape": inputs' shape + targets' shape, "lower_s", "compile_s", "flops" (model FLOPs of a
    step, model/flops.py's), "xla_flops" (XLA's count, a cross-check), "compilation_cache"}`.
    """
    compiled = trainer.compile_train_step(state, batch)
    log.info(
        "compiled the train step for shape %s: lower %.1f s, compile %.1f s",
        shape,
        compiled.lower_s,
        compiled.compile_s,
    )
    writer.write(
        step,
        "compile",
        {
            "shape": list(shape),
            "lower_s": compiled.lower_s,
            "compile_s": compiled.compile_s,
            "flops": compiled.flops,  # model FLOPs (the analytic count); XLA's beside
            "xla_flops": compiled.xla_flops or None,
            # with JAX's persistent cache (platform.compilation_cache), compile_s may be a read
            "compilation_cache": jax.config.jax_compilation_cache_dir or None,
        },
    )
    return compiled


def train_loop(run: Run, num_steps: int | None = None) -> dict[str, Any]:
    """Trains run.state to num_steps (default cfg.train.num_steps); returns the last metrics.

    On SIGTERM or Ctrl-C (preemption.py), or when the lead's stdout reader has gone, it
    stops after the current step, saves that step, waits for the save and returns early with
    `stopped_by` (the signal's name: SIGTERM, SIGINT, SIGPIPE) and `step` in the metrics.
    """
    cfg, trainer = run.cfg, run.trainer
    num_steps = cfg.train.num_steps if num_steps is None else num_steps
    lead = jax.process_index() == 0
    writer = MetricsWriter(run.workdir, enabled=lead)
    progress = Progress(num_steps, run.start_step)
    config_json = cfg.to_json_best_effort()
    # one executable per batch shape, compiled when the shape first comes: nothing compiles twice
    steps_by_shape: dict[tuple, CompiledStep] = {}
    state, step = run.state, run.start_step
    last_good = run.checkpointer.latest_step()
    window = LogWindow()  # the steps since the last log line
    checked_writes = 0  # writer.writes when stop_on_a_failed_write last looked
    t_log = time.time()
    metrics: dict[str, Any] = {}
    # read once: neither the host's memory nor this process's malloc settings change
    memory_limit, tunables = host.memory_limit_bytes(), host.tunables_active()
    memory_warned = False
    local_devices = jax.local_devices()
    profiler = Profiler(cfg.train.profile_steps, run.workdir, enabled=lead)

    def check_finite(step_metrics, at_step):
        loss = float(jax.device_get(step_metrics["loss"]))
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"non-finite loss ({loss}) by step {at_step}; stopped without saving. The last "
                f"good checkpoint is step {last_good} in {run.checkpointer.directory} "
                "(training resumes from it; lower optim.lr_factor or raise optim.warmup_steps)."
            )

    with contextlib.ExitStack() as cleanup:  # on the way out, however: last in, first done
        cleanup.enter_context(notices.watching(lambda note: _stop_for_another(run, note)))
        cleanup.callback(progress.close)
        cleanup.callback(writer.close)
        stop = cleanup.enter_context(preemption.StopRequest())  # signals stop after a step
        cleanup.callback(run.checkpointer.wait)  # with the handlers on: a 2nd signal exits
        cleanup.callback(lambda: profiler.close(state))  # the state when the loop ends
        while step < num_steps:
            local = next(run.train_iter)
            shape = tuple(local["inputs"].shape) + tuple(local["targets"].shape)
            batch = sharding.global_batch(local, trainer.mesh)
            if shape not in steps_by_shape:
                steps_by_shape[shape] = compile_for_shape(
                    trainer, state, batch, shape, step + 1, writer
                )
                # throughput is of steps: the compile time is in its own record
                t_log += steps_by_shape[shape].lower_s + steps_by_shape[shape].compile_s
            compiled = steps_by_shape[shape]
            profiler.before(step + 1, state)
            with profiler.annotate(step + 1):
                state, m = compiled(state, batch)
            step += 1
            profiler.after(step, state)
            window.add(m, local, compiled.flops)

            if step % cfg.train.log_every_steps == 0 or step == num_steps:
                check_finite(window.sums, step)
                sums = losses.normalize_metrics(jax.device_get(window.sums))  # on the host now
                dt = time.time() - t_log
                updates = step // cfg.optim.accumulate_steps
                rss, peak_rss = host.resident_bytes()
                if not memory_warned:
                    warning = host.memory_warning(rss, memory_limit, tunables)
                    if warning:
                        log.warning("step %d: %s", step, warning)
                        memory_warned = True
                metrics = {
                    **sums,
                    "lr": float(trainer.schedule(max(updates - 1, 0))),
                    "grad_norm": float(window.sums["grad_norm"]) / window.steps,
                    "target_tokens_per_s": sums["tokens"] / dt,
                    "steps_per_s": window.steps / dt,
                    "padding_efficiency": window.real / max(window.slots, 1),
                    "flops_per_s": window.flops / dt,
                    "rss_bytes": rss,
                    "peak_rss_bytes": peak_rss,
                    # accelerators' own counters (None on CPU, where RSS is the memory)
                    **(report.device_memory(local_devices) or {}),
                }
                writer.write(step, "train", metrics)
                if lead and not progress.update(step, metrics):
                    # stdout's reader went away (the harness that ran this was killed): stop
                    # as SIGPIPE would, but with a step saved. Several hosts must save the
                    # same step (preemption.py), so there they agree on one first
                    why = "stdout's reader went away (SIGPIPE)"
                    stop.request_everywhere(preemption.signal.SIGPIPE, why)
                window = LogWindow()
                t_log = time.time()

            if step % cfg.train.eval_every_steps == 0 or step == num_steps:
                ev = perplexity(trainer.eval_step, state.params, run.eval_batches, trainer.mesh)
                writer.write(step, "eval", ev)
                log.info("step %d eval %s", step, ev)
                metrics.update({f"eval_{k}": v for k, v in ev.items()})
                t_log = time.time()  # keep eval time out of tokens/s

            if writer.writes != checked_writes:  # at the same steps on every host
                checked_writes = writer.writes
                stop_on_a_failed_write(run, writer)
            if not stop.requested and run.checkpointer.reached_preemption(step):
                stop.arm_for_save(preemption.signal.SIGTERM)  # all hosts save this step
            final = step == num_steps or stop.requested
            if final or run.checkpointer.should_save(step):
                _check_lease(run)  # a run whose workdir was taken over must not save into it
                if window.sums is not None:
                    check_finite(window.sums, step)  # never checkpoint a state a NaN went into
                saved = run.checkpointer.maybe_save(
                    step, state, run.train_iter.get_state(), config_json, force=True
                )
                if saved:
                    last_good = step
                    writer.flush()  # a gs:// metrics.jsonl is as recent as the checkpoint
            if stop.requested:
                run.checkpointer.wait()  # committed before we say so
                metrics.update(stopped_by=stop.name, step=step)
                log.info("%s: saved step %d; stopping", stop.name, step)
                break
    run.state = state
    stop_on_a_failed_write(run, writer)  # the flush on the way out came after the last check
    return metrics


def stop_on_a_failed_write(run: Run, writer: MetricsWriter) -> None:
    """Stops every host if the lead's metrics.jsonl write failed (a full disk), each naming the
    file and the newest complete checkpoint. Every host calls it at the same steps; with several
    the lead's errno is broadcast, where the lead used to stop alone and leave the others waiting
    (reporting.MetricsWriter)."""
    code = 0 if writer.failed is None else writer.failed.errno or errno.EIO
    if jax.process_count() > 1:
        code = int(multihost_utils.broadcast_one_to_all(np.int32(code)))
    if not code:
        return
    e = writer.failed or OSError(code, os.strerror(code), writer.path)
    writer.failed, writer.enabled = None, False  # said here, once
    if storage.is_disk_full(e):
        raise run.checkpointer.disk_full_error(e)
    raise e


def _check_lease(run: Run) -> None:
    """LeaseHeldError on every process if process 0's lease on the workdir was taken over."""
    lost = run.lease is not None and run.lease.lost is not None
    if jax.process_count() > 1:
        lost = bool(multihost_utils.broadcast_one_to_all(np.int32(lost)))
    if lost:
        if run.lease is not None:
            run.lease.check()
        raise lease.LeaseHeldError(
            f"process 0 lost the lease on workdir {run.workdir} (another `train` took it over); "
            "this run stopped without saving. Its log says who"
        )


def train_and_evaluate(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """The `train` command: set up (or resume) and train to cfg.train.num_steps, holding the
    workdir's lease (platform/lease.py) from before anything is written until the end."""
    storage.makedirs(workdir)
    with lease.hold_workdir(
        workdir, ttl=cfg.train.lease_ttl_secs, wait_secs=cfg.train.lease_wait_secs
    ) as held:
        run = setup_run(cfg, workdir)
        run.lease = held
        try:
            return train_loop(run)
        finally:
            run.checkpointer.close()
