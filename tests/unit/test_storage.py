"""platform/storage.py, the one path layer: URLs stay URLs, local writes are whole, appends
append, and a gs:// path without the gcs extra is an error naming it."""

import errno
import importlib.util
import os

import pytest

from tfm_jax.platform import storage


def test_urls_stay_urls_and_local_paths_stay_local(tmp_path):
    assert storage.join("gs://b/run", "vocab", "x.model") == "gs://b/run/vocab/x.model"
    assert storage.dirname("gs://b/run/vocab/x.model") == "gs://b/run/vocab"
    assert storage.join(str(tmp_path), "a") == os.path.join(str(tmp_path), "a")
    assert storage.is_remote("gs://b") and not storage.is_remote(str(tmp_path))
    storage.makedirs("gs://b/never/created")  # object storage has no folders: nothing to do
    assert not [p for p in os.listdir(".") if p.startswith("gs:")]


def test_local_writes_are_whole_and_appends_append(tmp_path):
    target = tmp_path / "deep" / "file.json"
    storage.write_text(target, "one")
    storage.write_text(target, "two")
    assert target.read_text() == "two" and os.listdir(target.parent) == ["file.json"]
    lines = tmp_path / "metrics.jsonl"
    storage.append_lines(lines, ["a"])
    storage.append_lines(lines, ["b", "c"])
    storage.append_lines(lines, [])
    assert lines.read_text() == "a\nb\nc\n"
    assert storage.file_state(lines)[0] == 6 and storage.file_state(tmp_path / "no") == (-1, -1)


def test_copy_tree_copies_every_file_and_each_folders_markers_last(tmp_path, monkeypatch):
    files = {"a.txt": b"a", "commit": b"top", "z": b"z", "sub/b.bin": bytes(range(256)),
             "sub/commit": b"c", "sub/deep/x": b"x", "sub/deep/y": b""}  # fmt: skip
    for name, data in files.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(data)
    dst, written, copy = tmp_path / "out" / "dst", [], storage.copy_file

    def recording(src, p):
        written.append(os.path.relpath(p, dst))
        copy(src, p)

    monkeypatch.setattr(storage, "copy_file", recording)
    storage.copy_tree(str(tmp_path / "src"), str(dst), last=("commit",))
    assert {name: (dst / name).read_bytes() for name in files} == files
    assert sorted(written) == sorted(files)
    for folder in ("", "sub/"):  # its marker after every file in it and under it
        inside = [w for w in written if w.startswith(folder)]
        assert inside[-1] == folder + "commit", written
    storage.copy_tree(str(tmp_path / "src" / "sub" / "b.bin"), str(tmp_path / "one" / "b.bin"))
    assert (tmp_path / "one" / "b.bin").read_bytes() == files["sub/b.bin"]


def test_gs_without_the_gcs_extra_names_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a)
    )
    with pytest.raises(storage.StorageError, match=r"pip install .*\[gcs\]"):
        storage.path("gs://bucket/run/config.json")


def test_the_cli_says_so_in_one_line(monkeypatch, capsys):
    from tfm_jax.cli import errors

    assert errors.report(storage.StorageError("gs://b: ... '.[gcs]'")) == 1
    assert capsys.readouterr().err.strip() == "error: gs://b: ... '.[gcs]'"


def test_a_failed_append_names_its_file():
    """Python's OSError from writing or flushing names no file; metrics.jsonl's full disk must."""
    with pytest.raises(OSError) as full:
        storage.append_lines("/dev/full", ["a line"])
    assert full.value.errno == errno.ENOSPC and full.value.filename == "/dev/full"
    assert storage.is_disk_full(full.value)  # what the CLI, the loop and a failed save ask
    assert not storage.is_disk_full(OSError(errno.EIO, "I/O error"))
    assert not storage.is_disk_full(ValueError("No space left"))
