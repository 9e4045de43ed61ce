"""Tests for tfm_jax/data/token_cache.py: the training split tokenized once, memory-mapped after."""

import errno
import json
import logging
import os
import socket
import threading
import time

import numpy as np
import pytest
from helpers import data_config
from helpers.kv_store import KeyValueStore
from helpers.runs import write_tiny_corpus

from tfm_jax import data
from tfm_jax.cli import errors
from tfm_jax.data import DataError, cache_mirror, token_cache, tokenized
from tfm_jax.data.tokenized import tokenize_split
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.platform import notices, storage

ARRAYS = token_cache.ARRAYS


def _cfg(folder, **overrides):
    return data_config(
        folder, **{"vocab_size": 300, "max_len": 32, "packed_length": 64, **overrides}
    )


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """A 300-piece vocabulary of the tiny corpus (its file stays put; each test copies the text)."""
    corpus = write_tiny_corpus(str(tmp_path_factory.mktemp("corpus")), n_train=1500)
    return data.get_tokenizer(_cfg(corpus), str(tmp_path_factory.mktemp("work")))


@pytest.fixture
def setup(vocab, tmp_path):
    """(config on a fresh copy of the tiny corpus with the cache under tmp_path, tokenizer)."""
    corpus = write_tiny_corpus(str(tmp_path / "corpus"), n_train=1500)
    return _cfg(corpus, token_cache_dir=str(tmp_path / "tokens")), vocab


def _assert_same(a, b):
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def _cache_dirs(cfg):
    return sorted(os.listdir(cfg.token_cache_dir)) if os.path.isdir(cfg.token_cache_dir) else []


def _no_tokenizing(monkeypatch):
    def fail(*args, **kwargs):
        pytest.fail("tokenized again")

    monkeypatch.setattr(Tokenizer, "encode_batch", fail)
    monkeypatch.setattr(token_cache, "encode_split", fail)


def test_config_key_defaults_to_beside_the_vocabulary(vocab, tmp_path):
    cfg = _cfg(tmp_path)
    assert cfg.token_cache_dir is None and cfg.get_type("token_cache_dir") is str
    root = token_cache.cache_root(cfg, vocab)
    assert root == os.path.join(os.path.dirname(os.path.abspath(vocab.path)), "tokens")
    assert token_cache.cache_root(_cfg(tmp_path, token_cache_dir=""), vocab) is None
    assert token_cache.cache_root(cfg, Tokenizer(vocab.model_proto)) is None  # no file, no dir


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
def test_cached_equals_uncached_and_second_call_maps(setup, monkeypatch, overlong):
    cfg, tok = setup
    want = tokenize_split(cfg, tok, "train", overlong)
    first = token_cache.cached_tokenize_split(cfg, tok, "train", overlong)
    _assert_same(first, want)
    (name,) = _cache_dirs(cfg)
    files = sorted(os.listdir(os.path.join(cfg.token_cache_dir, name)))
    assert files == sorted([f"{a}.npy" for a in ARRAYS] + ["meta.json"])
    with open(os.path.join(cfg.token_cache_dir, name, "meta.json")) as f:
        meta = json.load(f)
    assert meta["num_pairs"] == len(want) and meta["key"]["max_len"] == cfg.max_len
    assert meta["key"]["overlong"] == overlong and meta["key"]["vocab_sha256"] == tok.content_hash
    _no_tokenizing(monkeypatch)
    again = token_cache.cached_tokenize_split(cfg, tok, "train", overlong)
    _assert_same(again, want)
    assert all(isinstance(getattr(again, a), np.memmap) for a in ARRAYS)


def test_parallel_build_equals_serial(setup, monkeypatch):
    cfg, tok = setup
    monkeypatch.setattr(tokenized, "_POOL_MIN_PAIRS", 0)  # workers even for 1500 pairs
    cfg.max_len = 20  # some pairs dropped, so pair_index has gaps
    want = tokenize_split(cfg, tok, "train", "drop")
    assert len(want) < 1500
    chunks = tokenized.encode_split(cfg, tok, "train", "drop", num_workers=2)
    assert len(chunks) > 2  # several chunks, spread over two processes
    got = token_cache.cached_tokenize_split(cfg, tok, "train", "drop", num_workers=2)
    _assert_same(got, want)


def test_changed_source_vocabulary_or_max_len_rebuild(setup, tmp_path, caplog, monkeypatch):
    cfg, tok = setup
    token_cache.cached_tokenize_split(cfg, tok, "train", "drop")
    for lang, line in (("en", "A new pair.\n"), ("de", "Ein neues Paar.\n")):
        with open(os.path.join(cfg.dir, f"train.{lang}"), "a", encoding="utf-8") as f:
            f.write(line)
    with caplog.at_level(logging.INFO, logger="tfm_jax.data.token_cache"):
        got = token_cache.cached_tokenize_split(cfg, tok, "train", "drop")
    assert "the source changed" in caplog.text
    _assert_same(got, tokenize_split(cfg, tok, "train", "drop"))
    assert len(got) == len(tokenize_split(cfg, tok, "train", "drop")) and got.pair_index[-1] == 1500
    assert len(_cache_dirs(cfg)) == 1  # rebuilt in place, no stale copy left

    other = data.get_tokenizer(_cfg(cfg.dir, vocab_size=200), str(tmp_path / "work2"))
    _assert_same(
        token_cache.cached_tokenize_split(cfg, other, "train", "drop"),
        tokenize_split(cfg, other, "train", "drop"),
    )
    shorter = _cfg(cfg.dir, token_cache_dir=cfg.token_cache_dir, max_len=16)
    _assert_same(
        token_cache.cached_tokenize_split(shorter, tok, "train", "drop"),
        tokenize_split(shorter, tok, "train", "drop"),
    )
    assert len(_cache_dirs(cfg)) == 3  # variants side by side
    _no_tokenizing(monkeypatch)  # and each still maps
    token_cache.cached_tokenize_split(shorter, tok, "train", "drop")
    token_cache.cached_tokenize_split(cfg, other, "train", "drop")


def test_leftover_temp_dirs_are_ignored(setup):
    cfg, tok = setup
    key = token_cache.cache_key(cfg, tok, "train", "drop")
    final = os.path.join(cfg.token_cache_dir, token_cache.cache_dir_name(key))
    dead = f"{final}.tmp-{socket.gethostname()}-{2**22 + 12345}"  # beyond Linux's pid_max
    elsewhere = f"{final}.tmp-another-host-77"  # another host's: maybe still building
    for leftover in (dead, elsewhere):
        os.makedirs(leftover)
        with open(os.path.join(leftover, "meta.json"), "w") as f:
            json.dump({"key": key, "num_pairs": 3}, f)  # a half-written build
        with open(os.path.join(leftover, "src_ids.npy"), "wb") as f:
            f.write(b"\x93NUMPY garbage")
    got = token_cache.cached_tokenize_split(cfg, tok, "train", "drop")
    _assert_same(got, tokenize_split(cfg, tok, "train", "drop"))
    assert not os.path.exists(dead) and os.path.isdir(elsewhere)


@pytest.mark.parametrize("damage", ["meta_missing", "array_truncated", "meta_garbled"])
def test_incomplete_or_damaged_cache_rebuilds(setup, caplog, damage):
    cfg, tok = setup
    want = token_cache.cached_tokenize_split(cfg, tok, "train", "drop")
    want = {a: np.array(getattr(want, a)) for a in ARRAYS}
    (name,) = _cache_dirs(cfg)
    path = os.path.join(cfg.token_cache_dir, name)
    if damage == "meta_missing":
        os.remove(os.path.join(path, "meta.json"))
    elif damage == "array_truncated":
        with open(os.path.join(path, "tgt_ids.npy"), "r+b") as f:
            f.truncate(200)
    else:
        with open(os.path.join(path, "meta.json"), "w") as f:
            f.write('{"key": ')
    with caplog.at_level(logging.INFO, logger="tfm_jax.data.token_cache"):
        got = token_cache.cached_tokenize_split(cfg, tok, "train", "drop")
    why = "no meta.json" if damage == "meta_missing" else "unreadable"
    assert f"building ({why}" in caplog.text
    for a in ARRAYS:
        np.testing.assert_array_equal(getattr(got, a), want[a])


def test_other_processes_wait_for_process_0(setup):
    cfg, tok = setup
    with pytest.raises(DataError, match=r"process 1 waited 0 s for process 0.*shared filesystem"):
        token_cache.cached_tokenize_split(
            cfg, tok, "train", "drop", process_index=1, wait_timeout_s=0.2, poll_s=0.05
        )
    assert _cache_dirs(cfg) == []  # waiting never builds
    got = {}

    def host_1():
        got[1] = token_cache.cached_tokenize_split(
            cfg, tok, "train", "drop", process_index=1, wait_timeout_s=60, poll_s=0.02
        )

    waiter = threading.Thread(target=host_1)
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()  # still waiting: nothing is built
    got[0] = token_cache.cached_tokenize_split(cfg, tok, "train", "drop", process_index=0)
    waiter.join(60)
    assert not waiter.is_alive()
    _assert_same(got[1], got[0])
    # A stale cache (the source changed since) is never read by a waiting process.
    with open(os.path.join(cfg.dir, "train.en"), "a", encoding="utf-8") as f:
        f.write("x\n")
    with open(os.path.join(cfg.dir, "train.de"), "a", encoding="utf-8") as f:
        f.write("y\n")
    with pytest.raises(DataError, match="last: the source changed"):
        token_cache.cached_tokenize_split(
            cfg, tok, "train", "drop", process_index=1, wait_timeout_s=0.1, poll_s=0.02
        )


def test_a_failed_build_on_process_0_stops_the_waiting_processes_with_its_error(setup, monkeypatch):
    """Process 0 fails writing the cache (here a file-size limit): process 1 used to poll for
    the files for its 30-minute timeout; the error the CLI leaves in the job's key-value store
    now stops it at its next poll."""
    cfg, tok = setup
    store = KeyValueStore()
    monkeypatch.setattr(notices, "client", lambda: store)

    def too_large(*args, **kwargs):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), "/cache/src_ids.npy")

    monkeypatch.setattr(token_cache, "build_cache", too_large)
    got = {}

    def host_1():
        try:
            token_cache.cached_tokenize_split(
                cfg, tok, "train", "drop", process_index=1, wait_timeout_s=60, poll_s=0.02
            )
        except notices.AnotherProcessFailed as e:
            got[1] = e

    waiter = threading.Thread(target=host_1)
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()  # waiting: nothing is built, nothing told
    with pytest.raises(DataError) as failed:
        token_cache.cached_tokenize_split(cfg, tok, "train", "drop", process_index=0)
    errors.tell_the_other_processes(failed.value)  # as the CLI does on its way out
    start = time.monotonic()
    waiter.join(60)
    assert time.monotonic() - start < 5 and not waiter.is_alive()
    key = token_cache.cache_key(cfg, tok, "train", "drop")
    final = os.path.join(cfg.token_cache_dir, token_cache.cache_dir_name(key))
    assert str(failed.value) == (
        f"could not write the token cache {final} (File too large). Make room there, or set "
        'data.token_cache_dir to another folder ("": no cache, each host tokenizes in memory)'
    )
    assert str(got[1]) == (
        f"process 1 stopped waiting for the token cache {final}: process 0 failed: {failed.value}"
    )


def test_a_bucket_copy_that_fails_says_which_copy(setup, tmp_path, monkeypatch):
    """With the cache in a bucket (here a folder the storage layer treats as one), an OSError is
    one line naming the copy that failed: the lead's publish, another host's copy from the
    bucket. Both used to say "could not write the token cache" (or were a traceback)."""
    cfg, tok = setup
    bucket = str(tmp_path / "bucket")
    cfg.token_cache_dir = bucket
    monkeypatch.setattr(storage, "is_remote", lambda p: os.fspath(p).startswith(bucket))
    monkeypatch.setenv("TFM_JAX_SCRATCH", str(tmp_path / "host0"))
    key = token_cache.cache_key(cfg, tok, "train", "drop")
    name = token_cache.cache_dir_name(key)
    final, local = f"{bucket}/{name}", cache_mirror.local_path(bucket, name)
    os.makedirs(final)  # a bucket has no folders to make; this stand-in needs its one
    publish = cache_mirror.publish

    def denied(*args, **kwargs):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), final)

    monkeypatch.setattr(cache_mirror, "publish", denied)
    with pytest.raises(DataError) as failed:
        token_cache.cached_tokenize_split(cfg, tok, "train", "drop", process_index=0)
    room = 'Make room there, or set data.token_cache_dir to another folder ("": no cache, '
    assert str(failed.value) == (
        f"could not publish the token cache {local} to {final} (Permission denied). "
        f"{room}each host tokenizes in memory)"
    )
    monkeypatch.setattr(cache_mirror, "publish", publish)
    token_cache.cached_tokenize_split(cfg, tok, "train", "drop", process_index=0)
    assert cache_mirror.published(final, key)

    def unreachable(*args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO), final)

    monkeypatch.setenv("TFM_JAX_SCRATCH", str(tmp_path / "host1"))  # another host's mirror
    monkeypatch.setattr(cache_mirror, "fetch", unreachable)
    with pytest.raises(DataError) as failed:
        token_cache.cached_tokenize_split(cfg, tok, "train", "drop", process_index=1)
    assert str(failed.value) == (
        f"could not copy the token cache {final} into {cache_mirror.local_path(bucket, name)} "
        f"(Input/output error). {room}each host tokenizes in memory)"
    )


def test_train_iterator_uses_the_cache_and_matches_cache_off(setup, tmp_path, monkeypatch):
    cfg, tok = setup
    cfg.packing = True
    off = _cfg(cfg.dir, token_cache_dir="", packing=True)
    ref = data.make_train_iterator(off, tok, seed=0)
    assert _cache_dirs(cfg) == []
    data.make_train_iterator(cfg, tok, seed=0)  # builds
    _no_tokenizing(monkeypatch)
    it = data.make_train_iterator(cfg, tok, seed=0)
    assert it.get_state() == ref.get_state()
    for _ in range(3):
        a, b = next(ref), next(it)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    shards = [
        data.make_train_iterator(cfg, tok, seed=0, process_index=i, process_count=2) for i in (1, 0)
    ]
    assert len(shards[0].split) == len(it.split)
