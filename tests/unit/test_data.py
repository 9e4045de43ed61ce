"""Tests for tfm_jax/data: sources, sentencepiece, token-budget batching, resume, sharding."""

import collections
import io
import json
import logging
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import sentencepiece as spm
from helpers import data_config
from helpers.runs import MULTI30K

from tfm_jax import data
from tfm_jax.data import DataError, sources, tokenizer
from tfm_jax.data.bpe_dropout import BpeDropout
from tfm_jax.data.tokenized import tokenize_split
from tfm_jax.vocab_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def _write(folder, split, lang, lines, newline="\n"):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{split}.{lang}"), "w", encoding="utf-8", newline="") as f:
        f.write("".join(line + newline for line in lines))


_cfg = data_config


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The first 1200 Multi30k train pairs (and 300 val) as a folder, with a 600-piece vocab."""
    folder = tmp_path_factory.mktemp("small")
    for split, start, n in (("train", 0, 1200), ("val", 0, 300)):
        for lang in ("en", "de"):
            with open(os.path.join(MULTI30K, f"{split}.{lang}"), encoding="utf-8") as f:
                lines = [line.rstrip("\n") for line in f][start : start + n]
            _write(folder, split, lang, lines)
    cfg = _cfg(folder)
    tok = data.get_tokenizer(cfg, str(tmp_path_factory.mktemp("work")))
    return cfg, tok


def _pairs_in(batch):
    """(source ids, target ids) of every real pair in a batch, EOS included."""
    out = []
    for r in range(batch["inputs"].shape[0]):
        if "inputs_segmentation" in batch:
            seg_in, seg_tg = batch["inputs_segmentation"][r], batch["targets_segmentation"][r]
            for k in range(1, int(seg_in.max()) + 1):
                out.append(
                    (
                        tuple(batch["inputs"][r][seg_in == k]),
                        tuple(batch["targets"][r][seg_tg == k]),
                    )
                )
        elif (batch["inputs"][r] != PAD_ID).any():
            out.append(
                (
                    tuple(batch["inputs"][r][batch["inputs"][r] != PAD_ID]),
                    tuple(batch["targets"][r][batch["targets"][r] != PAD_ID]),
                )
            )
    return out


def _expected_pairs(cfg, tok, split, overlong):
    src, tgt = data.load_split_texts(cfg, split)
    out = []
    for s, t in zip(src, tgt, strict=True):
        s, t = tok.encode(s), tok.encode(t)
        if max(len(s), len(t)) + 1 > cfg.max_len:
            if overlong == "drop":
                continue
            s, t = s[: cfg.max_len - 1], t[: cfg.max_len - 1]
        out.append((tuple(s + [EOS_ID]), tuple(t + [EOS_ID])))
    return out


def _epoch(it):
    return [next(it) for _ in range(it.batches_per_epoch - it.step)]


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- config


def test_config_defaults_and_placeholders():
    cfg = data.default_data_config()
    assert cfg.source == "folder" and cfg.tfds_name == "wmt14_translate/de-en"
    assert (cfg.source_lang, cfg.target_lang) == ("en", "de")
    assert cfg.vocab_path is None and cfg.tfds_data_dir is None
    cfg.vocab_path = "/x/spm.model"  # placeholders accept their type once set
    assert cfg.tokens_per_batch == 25000  # §5.1


# ----------------------------------------------------------------------------- tokenizer


def test_round_trip_and_special_ids(small):
    cfg, tok = small
    assert tok.vocab_size == cfg.vocab_size
    src, tgt = data.load_split_texts(cfg, "val")
    covered = 0
    for text in src + tgt:
        ids = tok.encode(text)
        assert EOS_ID not in ids and PAD_ID not in ids and BOS_ID not in ids
        if UNK_ID not in ids:
            covered += 1
            assert tok.decode(ids) == text
    assert covered > 0.95 * len(src + tgt)
    ids = tok.encode("A man rides a bike.")
    assert tok.decode([BOS_ID] + ids + [EOS_ID] + ids + [PAD_ID]) == "A man rides a bike."
    assert tok.decode_batch(np.array([ids + [EOS_ID, PAD_ID]])) == ["A man rides a bike."]
    assert tok.encode_batch(["A man rides a bike."]) == [ids]


def test_bpe_dropout_golden_and_seeded(small):
    cfg, tok = small
    src, tgt = data.load_split_texts(cfg, "val")
    odd = ["Ein  Mann\tmit \u2708\u2708 Hut.", "", "  x ", "\u2708"]  # spaces, tab, unknowns
    texts = src + tgt + odd
    bpe = BpeDropout(tok, texts)
    # p = 0 is sentencepiece's own deterministic segmentation, text for text.
    assert bpe.sample(0.0, np.random.default_rng(0)) == tok.encode_batch(texts)
    a = bpe.sample(0.1, np.random.default_rng(5))
    assert a == bpe.sample(0.1, np.random.default_rng(5))
    assert a != bpe.sample(0.1, np.random.default_rng(6))
    # Another segmentation of the same (whitespace-normalized) text.
    assert tok.decode_batch(a) == tok.decode_batch(tok.encode_batch(texts))
    plain = sum(map(len, tok.encode_batch(texts)))
    more = sum(map(len, bpe.sample(0.3, np.random.default_rng(5))))
    assert 1.1 * plain < sum(map(len, a)) < more
    # Merges are dropped, never invented: every id is a piece, <unk> only where the
    # deterministic segmentation has one.
    assert all(UNK_ID <= i < tok.vocab_size for ids in a for i in ids)
    assert [UNK_ID in ids for ids in a] == [UNK_ID in ids for ids in tok.encode_batch(texts)]


def test_bpe_dropout_refuses_a_unigram_vocabulary(small):
    cfg, _ = small
    texts, _ = data.load_split_texts(cfg, "val")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        model_type="unigram",
        vocab_size=600,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
        unk_id=UNK_ID,
        minloglevel=2,
    )
    with pytest.raises(DataError, match="BPE-dropout needs a BPE model"):
        BpeDropout(tokenizer.Tokenizer(model.getvalue()), texts)


def test_bpe_dropout_same_in_a_new_process(small, tmp_path):
    """The property sentencepiece's own sampling lacks (bpe_dropout.py): a seed gives one
    segmentation in every process, so resumes and hosts agree."""
    cfg, tok = small
    texts, _ = data.load_split_texts(cfg, "val")
    script = (
        "import sys, json, numpy as np\n"
        "from tfm_jax.data.tokenizer import Tokenizer\n"
        "from tfm_jax.data.bpe_dropout import BpeDropout\n"
        "texts = json.load(open(sys.argv[2]))\n"
        "bpe = BpeDropout(Tokenizer.load(sys.argv[1]), texts)\n"
        "print(json.dumps(bpe.sample(0.1, np.random.default_rng(9))))\n"
    )
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    out = subprocess.run(
        [sys.executable, "-c", script, tok.path, str(tmp_path / "texts.json")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == BpeDropout(tok, texts).sample(0.1, np.random.default_rng(9))


def test_vocab_cached_and_keyed(small, tmp_path, monkeypatch):
    cfg, _ = small
    first = data.get_tokenizer(cfg, str(tmp_path))
    files = os.listdir(tmp_path / "vocab")
    monkeypatch.setattr(tokenizer, "train_sentencepiece", lambda c: pytest.fail("retrained"))
    again = data.get_tokenizer(cfg, str(tmp_path))
    assert again.encode("Two dogs play.") == first.encode("Two dogs play.")
    monkeypatch.undo()
    other = cfg.copy_and_resolve_references()
    other.vocab_size = 500
    assert data.get_tokenizer(other, str(tmp_path)).vocab_size == 500
    assert len(os.listdir(tmp_path / "vocab")) == len(files) + 1


def test_vocab_too_large_is_a_clear_error(tmp_path):
    _write(tmp_path, "train", "en", ["a b c", "b c a"])
    _write(tmp_path, "train", "de", ["x y z", "z y x"])
    with pytest.raises(DataError, match="vocab_size=5000 is too large.*Lower data.vocab_size"):
        data.get_tokenizer(_cfg(tmp_path, vocab_size=5000), str(tmp_path / "work"))


# ----------------------------------------------------------------------------- batching


@pytest.mark.parametrize("packing", [False, True])
def test_budget_shapes_and_exact_coverage(small, packing):
    cfg, tok = small
    cfg = _cfg(cfg.dir, packing=packing, max_len=24, overlong="drop")
    it = data.make_train_iterator(cfg, tok, seed=3, batch_multiple=4)
    batches = _epoch(it)
    shapes = {(b["inputs"].shape, b["targets"].shape) for b in batches}
    assert len(shapes) <= 8
    for b in batches:
        rows, s = b["inputs"].shape
        assert (
            rows * s <= cfg.tokens_per_batch
            and rows * b["targets"].shape[1] <= cfg.tokens_per_batch
        )
        assert rows % 4 == 0 and b["inputs"].dtype == np.int32 and b["targets"].dtype == np.int32
        assert ("inputs_segmentation" in b) == packing
    got = collections.Counter(p for b in batches for p in _pairs_in(b))
    want = collections.Counter(_expected_pairs(cfg, tok, "train", "drop"))
    assert got == want  # every kept pair exactly once, no BOS, EOS-terminated
    assert sum(want.values()) < 1200  # max_len=24 dropped some pairs


def test_packing_arrays_and_efficiency(small):
    cfg, tok = small
    cfg = _cfg(cfg.dir, packing=True)
    batch = next(data.make_train_iterator(cfg, tok, seed=0))
    for side in ("inputs", "targets"):
        ids, seg, pos = batch[side], batch[f"{side}_segmentation"], batch[f"{side}_position"]
        assert ((ids == PAD_ID) == (seg == 0)).all()
        for r in range(ids.shape[0]):
            for k in range(1, seg[r].max() + 1):
                m = seg[r] == k
                np.testing.assert_array_equal(pos[r][m], np.arange(m.sum()))
                assert ids[r][m][-1] == EOS_ID and BOS_ID not in ids[r][m]
        assert (pos[seg == 0] == 0).all()
    np.testing.assert_array_equal(
        batch["inputs_segmentation"].max(1), batch["targets_segmentation"].max(1)
    )
    eff = data.padding_efficiency(_epoch(data.make_train_iterator(cfg, tok, seed=0)))
    assert eff["distinct_shapes"] == 1 and eff["padding_efficiency"] > 0.85


def test_overlong_truncate_logs_and_keeps_all(small, caplog):
    cfg, tok = small
    cfg = _cfg(cfg.dir, max_len=12, overlong="truncate")
    with caplog.at_level(logging.WARNING):
        split = tokenize_split(cfg, tok, "train", cfg.overlong)
    assert len(split) == 1200 and split.src_lens.max() <= 12 and split.tgt_lens.max() <= 12
    assert "truncated" in caplog.text and "data.max_len=12" in caplog.text


def test_determinism_and_epoch_reshuffle(small):
    cfg, tok = small
    a = data.make_train_iterator(cfg, tok, seed=7)
    b = data.make_train_iterator(cfg, tok, seed=7)
    n = a.batches_per_epoch
    first_a = [next(a) for _ in range(n + 3)]
    first_b = [next(b) for _ in range(n + 3)]
    assert all(_same(x, y) for x, y in zip(first_a, first_b, strict=True))
    c = data.make_train_iterator(cfg, tok, seed=8)
    assert not all(_same(x, next(c)) for x in first_a[:3])
    # Epoch 1 is a different order of the same pairs.
    assert not all(_same(x, y) for x, y in zip(first_a[:3], first_a[n : n + 3], strict=True))


@pytest.mark.parametrize("packing", [False, True])
def test_resume_from_json_state(small, packing):
    cfg, tok = small
    cfg = _cfg(cfg.dir, packing=packing)
    ref = data.make_train_iterator(cfg, tok, seed=1)
    n = ref.batches_per_epoch
    stop = n - 2  # resume shortly before an epoch boundary
    for _ in range(stop):
        next(ref)
    state = json.loads(json.dumps(ref.get_state()))
    expected = [next(ref) for _ in range(5)]
    resumed = data.make_train_iterator(cfg, tok, seed=1)
    resumed.set_state(state)
    assert all(_same(e, next(resumed)) for e in expected)
    with pytest.raises(ValueError, match="seed"):
        data.make_train_iterator(cfg, tok, seed=2).set_state(state)


@pytest.mark.parametrize("packing", [False, True])
def test_bpe_dropout_epochs_cover_every_pair_resegmented(small, packing):
    cfg, tok = small
    cfg = _cfg(cfg.dir, packing=packing, max_len=24, overlong="drop", bpe_dropout=0.1)
    plain = data.make_train_iterator(_cfg(cfg.dir, packing=packing, max_len=24), tok, seed=3)
    it = data.make_train_iterator(cfg, tok, seed=3)
    assert it.global_shapes() == plain.global_shapes()  # the shapes stay the deterministic ones
    src, tgt = data.load_split_texts(cfg, "train")
    want = collections.Counter(
        (src[i], tgt[i]) for i in it.split.pair_index.tolist()
    )  # the pairs the deterministic segmentation keeps (max_len=24 dropped some)
    epochs = []
    for _ in range(2):
        pairs = [p for b in _epoch(it) for p in _pairs_in(b)]
        texts = collections.Counter((tok.decode(s), tok.decode(t)) for s, t in pairs)
        assert texts == want  # every kept pair once, re-segmented, none cut
        assert all(s[-1] == EOS_ID and t[-1] == EOS_ID for s, t in pairs)
        epochs.append(collections.Counter(pairs))
    assert sum(len(s) + len(t) for s, t in epochs[0].elements()) > 1.05 * sum(
        len(s) + len(t) for s, t in _expected_pairs(cfg, tok, "train", "drop")
    )
    assert epochs[0] != epochs[1]  # each epoch its own segmentation
    # Seeded: a second iterator, and one resumed mid-epoch 1, give the same batches.
    again = data.make_train_iterator(cfg, tok, seed=3)
    n = again.batches_per_epoch
    first = [next(again) for _ in range(n + 2)]
    for _ in range(2):
        fresh = data.make_train_iterator(cfg, tok, seed=3)
        assert all(_same(x, next(fresh)) for x in first[:3])
    resumed = data.make_train_iterator(cfg, tok, seed=3)
    resumed.set_state({**again.get_state(), "epoch": 1, "step": 0})
    assert all(_same(x, next(resumed)) for x in first[n : n + 2])


def test_process_shards_partition_global_batches(small):
    cfg, tok = small
    glob = data.make_train_iterator(cfg, tok, seed=0, batch_multiple=2)
    shards = [
        data.make_train_iterator(cfg, tok, seed=0, process_index=i, process_count=2)
        for i in range(2)
    ]
    for _ in range(4):
        g = next(glob)
        local = [next(s) for s in shards]
        assert local[0]["inputs"].shape[0] * 2 == g["inputs"].shape[0]
        for k in g:
            np.testing.assert_array_equal(np.concatenate([lb[k] for lb in local]), g[k])
    ev = data.make_eval_batches(cfg, tok, "val", batch_multiple=2)
    ev_shards = [
        data.make_eval_batches(cfg, tok, "val", process_index=i, process_count=2) for i in range(2)
    ]
    for g, l0, l1 in zip(ev, *ev_shards, strict=True):
        np.testing.assert_array_equal(np.concatenate([l0["targets"], l1["targets"]]), g["targets"])


def test_eval_batches_cover_every_pair_once(small):
    cfg, tok = small
    cfg = _cfg(cfg.dir, max_len=16, overlong="drop")  # eval never drops: it truncates
    batches = data.make_eval_batches(cfg, tok, "val", batch_multiple=4)
    got = collections.Counter(p for b in batches for p in _pairs_in(b))
    assert got == collections.Counter(_expected_pairs(cfg, tok, "val", "truncate"))
    assert sum(got.values()) == 300
    assert data.padding_efficiency(batches)["distinct_shapes"] <= 8
    again = data.make_eval_batches(cfg, tok, "val", batch_multiple=4)
    assert all(_same(a, b) for a, b in zip(batches, again, strict=True))


def test_token_budget_too_small_is_an_error(small):
    cfg, tok = small
    with pytest.raises(DataError, match="tokens_per_batch=64"):
        data.make_train_iterator(_cfg(cfg.dir, tokens_per_batch=64), tok, seed=0, batch_multiple=8)


# ----------------------------------------------------------------------------- bad input


def test_mismatched_line_counts(tmp_path):
    _write(tmp_path, "train", "en", ["a", "b", "c"])
    _write(tmp_path, "train", "de", ["x", "y"])
    pattern = r"train\.en has 3 lines but .*train\.de has 2.*shorter file: 3\). Re-align"
    with pytest.raises(DataError, match=pattern):
        data.load_split_texts(_cfg(tmp_path), "train")


def test_missing_split_or_language_file(tmp_path):
    _write(tmp_path, "train", "en", ["a"])
    _write(tmp_path, "train", "de", ["x"])
    with pytest.raises(DataError, match=r"valid\.en: file not found.*train\.de"):
        data.load_split_texts(_cfg(tmp_path), "valid")
    with pytest.raises(DataError, match=r"train\.fr: file not found"):
        data.load_split_texts(_cfg(tmp_path, target_lang="fr"), "train")
    with pytest.raises(DataError, match="does not exist"):
        data.load_split_texts(_cfg(tmp_path / "nope"), "train")


def test_sliced_splits_as_tfds_spells_them(tmp_path):
    """data.train_split="train[:50%]" and the like: those lines of the folder's files, taken
    before pairs with an empty side are dropped; a bad slice is a one-line DataError."""
    _write(tmp_path, "train", "en", [f"s{i}" for i in range(10)])
    _write(tmp_path, "train", "de", [f"t{i}" if i != 1 else "" for i in range(10)])
    cfg = _cfg(tmp_path)
    src, tgt = data.load_split_texts(cfg, "train[:50%]")
    assert src == ["s0", "s2", "s3", "s4"] and tgt == ["t0", "t2", "t3", "t4"]  # line 1 empty
    assert data.load_split_texts(cfg, "train[:30%]")[0] == ["s0", "s2"]
    assert data.load_split_texts(cfg, "train[7:]")[0] == ["s7", "s8", "s9"]
    assert data.load_split_texts(cfg, "train[25%:50%]")[0] == ["s2", "s3", "s4"]
    assert sources.split_name("train[:50%]") == "train"
    # a cache keyed by the split tells the slices apart; the files are the split's
    ident = [sources.source_identity(cfg, s) for s in ("train", "train[:50%]")]
    assert ident[0][0] != ident[1][0] and ident[0][1] == ident[1][1]
    for bad, why in (("train[:50", "expected a split name"), ("train[:150%]", "over 100%"),
                     ("train[5:5]", "selects no line")):  # fmt: skip
        with pytest.raises(DataError, match=why):
            data.load_split_texts(cfg, bad)


def test_invalid_utf8_names_file_and_line(tmp_path):
    _write(tmp_path, "train", "en", ["a", "b", "c"])
    with open(tmp_path / "train.de", "wb") as f:
        f.write(b"x\ny\nGr\xfc\xdfe\n")  # latin-1
    with pytest.raises(DataError, match=r"train\.de:3: invalid UTF-8.*iconv"):
        data.load_split_texts(_cfg(tmp_path), "train")


def test_empty_file(tmp_path):
    _write(tmp_path, "train", "en", ["a"])
    _write(tmp_path, "train", "de", [])
    with pytest.raises(DataError, match=r"train\.de: the file is empty"):
        data.load_split_texts(_cfg(tmp_path), "train")


def test_empty_lines_dropped_with_count_and_crlf(tmp_path, caplog):
    _write(tmp_path, "train", "en", ["one", "", "three", "four"], newline="\r\n")
    _write(tmp_path, "train", "de", ["eins", "zwei", "drei", " "], newline="\r\n")
    with caplog.at_level(logging.WARNING):
        src, tgt = data.load_split_texts(_cfg(tmp_path), "train")
    assert (src, tgt) == (["one", "three"], ["eins", "drei"])
    assert "dropped 2 pairs with an empty side" in caplog.text


def test_bad_config_values(tmp_path):
    _write(tmp_path, "train", "en", ["a"])
    _write(tmp_path, "train", "de", ["x"])
    with pytest.raises(DataError, match="data.source='hf'"):
        data.load_split_texts(_cfg(tmp_path, source="hf"), "train")
    with pytest.raises(DataError, match="overlong='cut'"):
        tokenize_split(_cfg(tmp_path, overlong="cut"), None, "train", "cut")


# ----------------------------------------------------------------------------- tfds

PAIRS = {
    "train": [(f"Hello number {i}.", f"Hallo Nummer {i}.") for i in range(40)],
    "validation": [("Good morning.", "Guten Morgen."), ("Thank you.", "Danke.")],
    "test": [("Yes.", "Ja."), ("No.", "Nein."), ("Maybe.", "Vielleicht.")],
}


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """A tiny prepared `wmt14_translate/de-en` (array_record) built without any download."""
    from tensorflow_datasets.core import registered
    from tensorflow_datasets.translate import wmt14

    with registered.skip_registration():

        class FixtureWmt14(wmt14.Wmt14Translate):
            name = "wmt14_translate"

            def _split_generators(self, dl_manager):
                return {split: self._examples(pairs) for split, pairs in PAIRS.items()}

            def _examples(self, pairs):
                for i, (en, de) in enumerate(pairs):
                    yield i, {"en": en, "de": de}

    root = tmp_path_factory.mktemp("tfds")
    FixtureWmt14(config="de-en", data_dir=str(root)).download_and_prepare(
        file_format="array_record"
    )
    return root


def test_tfds_source_reads_prepared_data(tfds_dir, tmp_path):
    cfg = _cfg(
        "unused",
        source="tfds",
        tfds_data_dir=str(tfds_dir),
        vocab_size=60,
        train_split="train",
        eval_split="validation",
        test_split="test",
    )
    src, tgt = data.load_split_texts(cfg, "test")
    assert sorted(zip(src, tgt, strict=True)) == sorted(PAIRS["test"])  # en -> de
    cfg.source_lang, cfg.target_lang = "de", "en"
    src, _ = data.load_split_texts(cfg, "validation")
    assert sorted(src) == sorted(de for _, de in PAIRS["validation"])
    cfg.source_lang, cfg.target_lang = "en", "de"
    tok = data.get_tokenizer(cfg, str(tmp_path))
    batch = next(data.make_train_iterator(cfg, tok, seed=0))
    assert tok.decode(batch["inputs"][0]).startswith("Hello number")
    with pytest.raises(DataError, match="no split 'val'"):
        data.load_split_texts(cfg, "val")
    with pytest.raises(DataError, match="no language 'fr'"):
        data.load_split_texts(
            _cfg("x", source="tfds", tfds_data_dir=str(tfds_dir), target_lang="fr"), "test"
        )


def test_tfds_offline_fails_fast_naming_folder_alternative(tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()
    monkeypatch.setattr(sources, "_PROBE_URL", f"http://127.0.0.1:{closed[1]}/")
    cfg = _cfg(MULTI30K, source="tfds", tfds_data_dir=str(tmp_path / "empty"))
    start = time.monotonic()
    with pytest.raises(
        DataError,
        match=r"not prepared under .*empty.*offline.*data\.source=folder "
        r"data\.dir=",
    ):
        data.load_split_texts(cfg, "train")
    assert time.monotonic() - start < 10


def test_silent_server_probe_times_out_quickly():
    with socket.socket() as server:  # accepts connections (backlog) but never answers
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        start = time.monotonic()
        assert not sources._online(f"http://127.0.0.1:{server.getsockname()[1]}/", timeout=0.5)
        assert time.monotonic() - start < 2
