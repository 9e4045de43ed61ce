"""Tests for tfm_jax/checkpoint/: round trip, retention, triggers, averaging, damage."""

import contextlib
import errno
import json
import logging
import os
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfm_jax.checkpoint import agreement, averaging, layout, reading, room
from tfm_jax.checkpoint import errors as ckpt_errors
from tfm_jax.checkpoint.manager import Checkpointer
from tfm_jax.platform import storage

CONFIG_JSON = json.dumps({"model": {"num_layers": 2, "d_model": 8}, "optim": {"warmup": 4}})
DATA_STATE = {"epoch": 1, "position": 12345, "files": ["a.tfrecord", "b.tfrecord"]}


@flax.struct.dataclass
class TrainState:
    """Stand-in for train.TrainState with the same fields."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def _mesh():
    return jax.sharding.Mesh(np.array(jax.devices()), ("data",))


def _shardings(mesh):
    row = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return row, rep


def _make_params(seed: int):
    row, rep = _shardings(_mesh())
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return {
        "dense": {
            "kernel": jax.device_put(jax.random.normal(k1, (4, 6)), row),
            "bias": jax.device_put(jax.random.normal(k2, (6,)), rep),
        },
        "embed": jax.device_put(jax.random.normal(k3, (8, 4), jnp.bfloat16), row),
    }


def _make_state(seed: int, step: int = 0) -> TrainState:
    params = _make_params(seed)
    tx = optax.adam(1e-3, b1=0.9, b2=0.98, eps=1e-9)
    opt_state = tx.init(params)
    # One real update so mu/nu/count are not all zeros.
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.5, params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return TrainState(
        step=jnp.asarray(step, jnp.int32),
        params=params,
        opt_state=opt_state,
        rng=jax.random.key_data(jax.random.key(seed + 100)),
    )


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _ckpt(tmp_path, **kw):
    kw = {"every_steps": 0, "every_secs": 0, "keep": 5, **kw}
    return Checkpointer(tmp_path, **kw)


def _save_steps(tmp_path, steps, **kw):
    states = {}
    with _ckpt(tmp_path, **kw) as ckpt:
        for step in steps:
            states[step] = _make_state(seed=step, step=step)
            data = {**DATA_STATE, "position": step}
            assert ckpt.maybe_save(step, states[step], data, CONFIG_JSON, force=True)
    return states


def test_round_trip_is_bitwise(tmp_path):
    state = _make_state(seed=0, step=7)
    with _ckpt(tmp_path, async_save=True) as ckpt:
        assert ckpt.latest_step() is None
        assert ckpt.maybe_save(7, state, DATA_STATE, CONFIG_JSON, force=True)
        # The async save must have copied the arrays off the device by now: train_step
        # donates (deletes) the state buffers right after maybe_save returns.
        donated = jax.tree.map(lambda x: x.copy(), state)
        for x in jax.tree.leaves(state):
            x.delete()
        state = donated
        ckpt.wait()
        assert ckpt.all_steps() == [7]

    with _ckpt(tmp_path) as ckpt:  # a fresh process resuming
        assert ckpt.latest_step() == 7
        restored, data_state, step = ckpt.restore_latest(_abstract(state))
    assert step == 7
    assert isinstance(restored, TrainState)
    _assert_trees_equal(restored, state)
    for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        assert x.sharding.is_equivalent_to(y.sharding, x.ndim)
    assert data_state == DATA_STATE
    assert reading.read_config_json(tmp_path) == json.loads(CONFIG_JSON)
    assert reading.read_config_json(tmp_path, which="7") == json.loads(CONFIG_JSON)
    _assert_trees_equal(reading.load_params(tmp_path, "7", _abstract(state.params)), state.params)


def test_restore_latest_empty_returns_none(tmp_path):
    with _ckpt(tmp_path) as ckpt:
        assert ckpt.restore_latest(_abstract(_make_state(0))) is None


def test_keeps_last_k(tmp_path):
    _save_steps(tmp_path, [1, 2, 3, 4], keep=2)
    with _ckpt(tmp_path, keep=2) as ckpt:
        assert ckpt.all_steps() == [3, 4]
        assert ckpt.latest_step() == 4


def test_keep_period_keeps_its_multiples_beyond_the_last_k(tmp_path):
    # evaluations every 4 steps, time-based saves between them: the evaluations' all stay (the
    # best is chosen at the end), of the others only the newest 2
    _save_steps(tmp_path, [1, 2, 4, 5, 6, 7, 8, 9, 10], keep=2, keep_period=4)
    with _ckpt(tmp_path, keep=2, keep_period=4) as ckpt:
        assert ckpt.all_steps() == [4, 8, 9, 10]
    with pytest.raises(ValueError, match="keep_period must be >= 0"):
        _ckpt(tmp_path, keep_period=-1)


def test_every_steps(tmp_path):
    state = _make_state(0)
    with _ckpt(tmp_path, every_steps=2, async_save=False) as ckpt:
        saved = [s for s in range(1, 6) if ckpt.maybe_save(s, state, DATA_STATE, CONFIG_JSON)]
        assert saved == [2, 4]
        # A forced final save of an already saved step is a no-op, not an error.
        assert not ckpt.maybe_save(4, state, DATA_STATE, CONFIG_JSON, force=True)
        assert ckpt.maybe_save(5, state, DATA_STATE, CONFIG_JSON, force=True)
        assert ckpt.all_steps() == [2, 4, 5]


def test_every_secs_uses_injected_clock(tmp_path):
    now = [1000.0]
    state = _make_state(0)
    with _ckpt(tmp_path, every_secs=600, clock=lambda: now[0], async_save=False) as ckpt:
        saved = []
        # (step, seconds since start): saves 600 s after start, then 600 s after that save.
        for step, t in [(1, 100), (2, 600), (3, 700), (4, 1199), (5, 1200), (6, 1300)]:
            now[0] = 1000.0 + t
            if ckpt.maybe_save(step, state, DATA_STATE, CONFIG_JSON):
                saved.append(step)
        assert saved == [2, 5]


def test_no_trigger_means_only_forced_saves(tmp_path):
    state = _make_state(0)
    with _ckpt(tmp_path, clock=lambda: 1e9) as ckpt:
        assert not any(ckpt.maybe_save(s, state, DATA_STATE, CONFIG_JSON) for s in range(1, 4))
        assert ckpt.all_steps() == []


def test_refuses_non_finite_params(tmp_path):
    state = _make_state(0)
    params = jax.tree.map(lambda x: x, state.params)
    params["dense"]["bias"] = params["dense"]["bias"].at[2].set(jnp.nan)
    with _ckpt(tmp_path) as ckpt:
        with pytest.raises(ckpt_errors.NonFiniteStateError, match=r"step 3.*\['dense'\]\['bias'\]"):
            ckpt.maybe_save(3, state.replace(params=params), DATA_STATE, CONFIG_JSON, force=True)
        ckpt.wait()
        assert ckpt.all_steps() == []


def test_rejects_non_json_data_state(tmp_path):
    with _ckpt(tmp_path) as ckpt:
        with pytest.raises(TypeError, match="data_state"):
            ckpt.maybe_save(1, _make_state(0), {"x": object()}, CONFIG_JSON, force=True)


def test_average_equals_mean_of_inputs(tmp_path):
    states = _save_steps(tmp_path, [1, 2, 3])
    abstract = _abstract(states[1].params)
    result = averaging.average_checkpoints(tmp_path, 2, abstract)
    assert result.steps == [2, 3]
    assert averaging.read_averaged_steps(tmp_path) == [2, 3]

    averaged = reading.load_params(tmp_path, "averaged", abstract)
    for path, leaf in jax.tree_util.tree_flatten_with_path(averaged)[0]:
        inputs = [np.asarray(_leaf(states[s].params, path), np.float32) for s in (2, 3)]
        expected = (np.mean(inputs, axis=0)).astype(leaf.dtype)
        np.testing.assert_allclose(
            np.asarray(leaf, np.float32), np.asarray(expected, np.float32), rtol=1e-6
        )
        assert leaf.dtype == _leaf(states[3].params, path).dtype
        assert leaf.sharding.is_equivalent_to(_leaf(abstract, path).sharding, leaf.ndim)
    assert reading.read_config_json(tmp_path, which="averaged") == json.loads(CONFIG_JSON)

    with pytest.raises(ValueError, match=r"only 3 complete ones exist.*steps \[1, 2, 3\]"):
        averaging.average_checkpoints(tmp_path, 5, abstract)


def _leaf(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def _truncate_state_files(step_dir):
    for f in (step_dir / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _truncate_array_data(step_dir):
    files = [f for f in (step_dir / "state").rglob("*") if f.is_file() and f.parent.name == "d"]
    assert files
    for f in files:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _delete_array_data(step_dir):
    files = [f for f in (step_dir / "state").rglob("*") if f.is_file() and f.parent.name == "d"]
    assert files
    for f in files:
        f.unlink()


def _remove_commit_marker(step_dir):
    (step_dir / "commit_success.txt").unlink()
    meta_file = step_dir / "_CHECKPOINT_METADATA"
    meta = json.loads(meta_file.read_text())
    meta["commit_timestamp_nsecs"] = None
    meta_file.write_text(json.dumps(meta))


# TensorStore callbacks of the failed read may fire after Orbax closed its event loop.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    "damage",
    [_truncate_state_files, _truncate_array_data, _delete_array_data, _remove_commit_marker],
)
def test_damaged_newest_falls_back_to_previous(tmp_path, caplog, damage):
    states = _save_steps(tmp_path, [1, 2, 3])
    damage(tmp_path / "checkpoints" / "3")
    with caplog.at_level(logging.WARNING):
        with _ckpt(tmp_path) as ckpt:
            state, data_state, step = ckpt.restore_latest(_abstract(states[3]))
            assert step == 2
            _assert_trees_equal(state, states[2])
            assert data_state["position"] == 2
            # The damaged step is moved aside, so training can save step 3 again.
            assert ckpt.all_steps() == [1, 2]
            assert list((tmp_path / "checkpoints").glob("3.corrupt-*"))
            assert ckpt.maybe_save(3, states[3], DATA_STATE, CONFIG_JSON, force=True)
    assert any("Skipping checkpoint 3" in r.getMessage() for r in caplog.records)


def test_killed_save_is_never_listed(tmp_path):
    # A save killed before its rename leaves only `<step>.orbax-checkpoint-tmp-<ts>`.
    states = _save_steps(tmp_path, [1, 2])
    ckpts = tmp_path / "checkpoints"
    (ckpts / "2").rename(ckpts / "2.orbax-checkpoint-tmp-1234567")
    with _ckpt(tmp_path) as ckpt:
        assert ckpt.all_steps() == [1]
        _, _, step = ckpt.restore_latest(_abstract(states[2]))
        assert step == 1
    assert reading.load_params(tmp_path, "latest", _abstract(states[1].params)) is not None


def test_a_copied_step_restores_and_a_copy_cut_off_never_restores_wrong(tmp_path, monkeypatch):
    state = _save_steps(tmp_path / "run", [4])[4]
    files = [f for f in (tmp_path / "run" / "checkpoints" / "4").rglob("*") if f.is_file()]
    copy_file, unfinished = storage.copy_file, 0
    for cut in range(len(files) + 1):  # the copy stops before its cut-th file (all at the end)
        copy, written = tmp_path / f"cut{cut}", []

        def full_disk(src, dst, written=written, cut=cut):
            if len(written) == cut:
                raise OSError(28, "No space left on device")
            written.append(dst)
            copy_file(src, dst)

        monkeypatch.setattr(storage, "copy_file", full_disk)
        with pytest.raises(OSError) if cut < len(files) else contextlib.nullcontext():
            layout.copy_step(str(tmp_path / "run"), str(copy), 4)
        monkeypatch.setattr(storage, "copy_file", copy_file)
        if layout.step_incomplete_reason(layout.checkpoints_dir(copy), 4):
            unfinished += 1
            continue
        with _ckpt(copy) as ckpt:  # what the reader takes for a whole save is the saved state
            restored, data_state, step = ckpt.restore_latest(_abstract(state))
        assert step == 4 and data_state["position"] == 4
        _assert_trees_equal(restored, state)
    # Only the copies that stopped at the step's own commit marker (written last; a local read
    # does not need it) are whole: every earlier cut is an unfinished save.
    assert unfinished == len(files) - 1


def test_mismatched_abstract_state_raises_and_moves_nothing(tmp_path):
    states = _save_steps(tmp_path, [1, 2])
    wrong = _abstract(states[2].replace(params={"other": jnp.zeros((3,))}))
    with _ckpt(tmp_path) as ckpt:
        with pytest.raises(ckpt_errors.CheckpointRestoreError, match="original config"):
            ckpt.restore_latest(wrong)
        assert ckpt.all_steps() == [1, 2]


def test_load_params_errors_say_what_exists(tmp_path):
    abstract = _abstract(_make_params(0))
    with pytest.raises(ckpt_errors.CheckpointNotFoundError) as e:
        reading.load_params(tmp_path, "averaged", abstract)
    msg = str(e.value)
    assert "no checkpoints" in msg
    assert f"python -m tfm_jax average --workdir={tmp_path} --last=5" in msg
    with pytest.raises(ckpt_errors.CheckpointNotFoundError, match="no complete checkpoint"):
        reading.load_params(tmp_path, "latest", abstract)
    with pytest.raises(ckpt_errors.CheckpointNotFoundError):
        reading.read_config_json(tmp_path)

    _save_steps(tmp_path, [4])
    with pytest.raises(ckpt_errors.CheckpointNotFoundError, match=r"steps \[4\] exist"):
        reading.load_params(tmp_path, "9", abstract)
    with pytest.raises(ValueError, match="'averaged', 'latest' or a step number"):
        reading.load_params(tmp_path, "best", abstract)


def test_a_save_that_will_not_fit_is_not_started(tmp_path, monkeypatch):
    """Checked before any host writes (checkpoint/room.py): a save that found the disk full left
    the other hosts waiting at Orbax's commit barrier for 20 minutes."""
    state = _make_state(1, step=1)
    free = {"bytes": 10**12}
    monkeypatch.setattr(storage, "free_bytes", lambda p: free["bytes"])
    with _ckpt(tmp_path, async_save=False) as ckpt:
        assert ckpt.maybe_save(1, state, DATA_STATE, CONFIG_JSON, force=True)
        size = storage.bytes_on_disk(tmp_path / "checkpoints" / "1")
        assert size > 0
        free["bytes"] = size  # room for exactly one more of the same size
        assert ckpt.maybe_save(2, state, DATA_STATE, CONFIG_JSON, force=True)
        need = storage.bytes_on_disk(tmp_path / "checkpoints" / "2")  # the newest's, now
        free["bytes"] = need - 1
        with pytest.raises(ckpt_errors.CheckpointSaveError) as short:
            ckpt.maybe_save(3, state, DATA_STATE, CONFIG_JSON, force=True)
        assert ckpt.all_steps() == [1, 2]
    assert str(short.value) == (
        f"checkpoint 3 was not started: {room._mb(need - 1)} are free in "
        f"{tmp_path / 'checkpoints'} and it needs about {room._mb(need)} (the size of "
        "checkpoint 2); training stopped. The newest complete checkpoint is still step 2. Free "
        "space on that filesystem (or move the workdir), then run the same command to resume "
        "from step 2"
    )


def test_a_full_disk_on_another_host_is_not_described_by_this_hosts_disk(tmp_path, monkeypatch):
    """A save that stopped for another host's error (agreement.SaveFailedOnAHost) says that
    error; this host's free space and state size describe a disk that is not the one that
    filled, so they are left out. This host's own full disk keeps them."""
    monkeypatch.setattr(storage, "free_bytes", lambda p: 3 * 2**20)
    state = _make_state(1, step=1)
    with _ckpt(tmp_path, async_save=False) as ckpt:
        assert ckpt.maybe_save(4, state, DATA_STATE, CONFIG_JSON, force=True)
        theirs = agreement.SaveFailedOnAHost(
            "process 0 failed: its part of the checkpoint could not be written: No space left "
            "on device (process 1 stopped waiting)"
        )
        mine = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        told, own = ckpt._save_error(8, theirs), ckpt._save_error(8, mine)
    then = (
        "; training stopped. The newest complete checkpoint is still step 4. Free space on that "
        "filesystem (or move the workdir), then run the same command to resume from step 4"
    )
    where = tmp_path / "checkpoints"
    assert str(told) == f"checkpoint 8 could not be saved in {where} ({theirs}){then}"
    size = f"{room.state_bytes(state) / 1e6:.1f} MB"
    assert str(own) == (
        f"checkpoint 8 could not be saved in {where} (no space left on the device; the train "
        f"state is {size} uncompressed, 3.1 MB are free there){then}"
    )


def test_a_first_save_is_estimated_from_the_state(tmp_path, monkeypatch):
    state = _make_state(1, step=1)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    monkeypatch.setattr(storage, "free_bytes", lambda p: int(0.8 * state_bytes) - 1)
    with _ckpt(tmp_path, async_save=False) as ckpt:
        with pytest.raises(ckpt_errors.CheckpointSaveError, match="the train state's") as short:
            ckpt.maybe_save(1, state, DATA_STATE, CONFIG_JSON, force=True)
        assert ckpt.all_steps() == []
    assert "No complete checkpoint was saved before it" in str(short.value)
    monkeypatch.setattr(storage, "free_bytes", lambda p: int(0.8 * state_bytes) + 1)
    with _ckpt(tmp_path, async_save=False) as ckpt:
        assert ckpt.maybe_save(1, state, DATA_STATE, CONFIG_JSON, force=True)


def test_object_storage_has_no_free_space_to_check(monkeypatch):
    monkeypatch.setattr(storage, "free_bytes", lambda p: 0)
    assert room.shortfall("gs://bucket/run/checkpoints", 1, None, _make_state(0)) is None
