"""§5.1 shared source-target BPE vocabulary (sentencepiece), trained once and cached."""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Iterable, Sequence

import ml_collections
import numpy as np
import sentencepiece as spm

from tfm_jax.config import paths
from tfm_jax.data.sources import DataError, open_split, split_name
from tfm_jax.platform import storage
from tfm_jax.vocab_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)


class Tokenizer:
    """Text <-> ids with the project's fixed special ids (vocab_ids.py)."""

    def __init__(self, model_proto: bytes, num_threads: int = 1):
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self._num_threads = num_threads
        self.path: str | None = None  # the file it came from, when it came from one
        got = (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id(), self._sp.unk_id())
        if got != (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
            raise DataError(
                f"sentencepiece model has (pad, eos, bos, unk) ids {got}; this project needs "
                f"{(PAD_ID, EOS_ID, BOS_ID, UNK_ID)}. Delete the model so it is retrained."
            )

    @classmethod
    def load(cls, path: str, num_threads: int = 1) -> Tokenizer:
        # the bytes through epath: sentencepiece itself cannot open a gs:// path
        return cls(storage.read_bytes(path), num_threads)

    @property
    def content_hash(self) -> str:
        """sha256 of the model proto: what its ids mean, whatever file it came from."""
        return hashlib.sha256(self.model_proto).hexdigest()

    @property
    def model_proto(self) -> bytes:
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without EOS."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), num_threads=self._num_threads)

    def encode_pieces_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """The pieces (strings) of each text's deterministic segmentation."""
        return self._sp.encode(list(texts), out_type=str, num_threads=self._num_threads)

    def pieces(self) -> tuple[list[str], list[float], list[bool]]:
        """Every id's piece, score and whether BPE may merge into or out of it (not a control,
        unknown, unused or byte piece)."""
        sp, n = self._sp, self._sp.get_piece_size()
        special = (sp.is_control, sp.is_unknown, sp.is_unused, sp.is_byte)
        return (
            [sp.id_to_piece(i) for i in range(n)],
            [sp.get_score(i) for i in range(n)],
            [not any(f(i) for f in special) for i in range(n)],
        )

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids` up to the first EOS; PAD and BOS are ignored."""
        out = []
        for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                out.append(i)
        return self._sp.decode(out)

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]


def _sample_sentences(cfg: ml_collections.ConfigDict) -> list[str]:
    """Both sides of the training split, or of a fixed random subset of its pairs."""
    pairs = open_split(cfg, cfg.train_split)
    n = len(pairs)
    want = max(1, cfg.vocab_sample_sentences // 2)
    if n <= want:
        sentences = []
        for src, tgt in pairs.iter_chunks(100_000):
            sentences += src + tgt
        return sentences
    idx = np.sort(np.random.default_rng(0).choice(n, size=want, replace=False))
    sentences = []
    for i in idx.tolist():
        sentences.extend(pairs[i])
    return [s for s in sentences if s]


def _source_fingerprint(cfg: ml_collections.ConfigDict) -> dict:
    """What the vocabulary depends on, so a changed corpus or setting retrains it."""
    key = {
        "source": cfg.source,
        "split": cfg.train_split,
        "langs": sorted([cfg.source_lang, cfg.target_lang]),
        "vocab_size": cfg.vocab_size,
        "sample": cfg.vocab_sample_sentences,
        "coverage": cfg.vocab_character_coverage,
    }
    if cfg.source == "folder":
        files = []
        for lang in key["langs"]:
            p = paths.resolve(storage.join(cfg.dir, f"{split_name(cfg.train_split)}.{lang}"))
            files.append([p, *storage.file_state(p)])
        key["files"] = files
    else:
        key["tfds"] = [cfg.tfds_name, cfg.tfds_data_dir or ""]
    return key


def train_sentencepiece(cfg: ml_collections.ConfigDict) -> bytes:
    """Trains the joint BPE model on the training split of both languages; returns its proto."""
    sentences = _sample_sentences(cfg)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            model_type="bpe",
            vocab_size=cfg.vocab_size,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            bos_id=BOS_ID,
            unk_id=UNK_ID,
            character_coverage=cfg.vocab_character_coverage,
            # "identity" (no NFKC) so decode(encode(text)) == text for covered text.
            normalization_rule_name="identity",
            input_sentence_size=cfg.vocab_sample_sentences,
            shuffle_input_sentence=True,
            num_threads=max(1, cfg.num_workers),
            minloglevel=2,
        )
    except RuntimeError as e:
        if "Vocabulary size" in str(e):
            raise DataError(
                f"data.vocab_size={cfg.vocab_size} is too large for the training split of "
                f"{cfg.source} {cfg.dir if cfg.source == 'folder' else cfg.tfds_name}: {e}. "
                f"Lower data.vocab_size."
            ) from None
        raise
    return model.getvalue()


def get_tokenizer(cfg: ml_collections.ConfigDict, workdir: str) -> Tokenizer:
    """Loads the cached vocabulary (data.vocab_path, else keyed under workdir) or trains it."""
    if cfg.vocab_path:
        path = cfg.vocab_path
    else:
        key = json.dumps(_source_fingerprint(cfg), sort_keys=True)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        path = storage.join(workdir, "vocab", f"spm_{cfg.vocab_size}_{digest}.model")
    if storage.exists(path):
        log.info("Loading sentencepiece model %s", path)
        tokenizer = Tokenizer.load(path, cfg.num_workers)
        tokenizer.path = path
        return tokenizer
    log.info("Training a %d-piece BPE vocabulary into %s", cfg.vocab_size, path)
    proto = train_sentencepiece(cfg)
    storage.write_bytes(path, proto)  # atomic: concurrent processes never read half a model
    tokenizer = Tokenizer(proto, cfg.num_workers)
    tokenizer.path = path  # a run pins this in its saved config (data.vocab_path)
    return tokenizer
