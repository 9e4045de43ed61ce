"""Tokenizes a split once into flat int32 id arrays plus per-pair offsets, EOS-terminated."""

from __future__ import annotations

import dataclasses
import logging

import ml_collections
import numpy as np

from tfm_jax.data.sources import DataError, open_split
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.vocab_ids import EOS_ID

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
    """Kept pairs of a split as flat ids (each sequence ends in EOS) plus offsets."""

    src_ids: np.ndarray  # int32 [total source tokens]
    src_offsets: np.ndarray  # int64 [num_pairs + 1]
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    pair_index: np.ndarray  # int64 [num_pairs]: index in load_split_texts order

    def __len__(self) -> int:
        return len(self.pair_index)

    @property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def src(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]


def tokenize_split(
    cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, split: str, overlong: str
) -> TokenizedSplit:
    """Encodes a split, appends EOS, and drops or truncates pairs over cfg.max_len per side."""
    if overlong not in ("drop", "truncate"):
        raise DataError(f'data.overlong={overlong!r}: expected "drop" or "truncate".')
    if cfg.max_len < 2:
        raise DataError(f"data.max_len={cfg.max_len}: needs room for a token and EOS (>= 2).")
    keep = cfg.max_len - 1  # room for EOS
    src_parts, tgt_parts, src_lens, tgt_lens, index = [], [], [], [], []
    n_seen = n_over = 0
    for src_text, tgt_text in open_split(cfg, split).iter_chunks(50_000):
        for s, t in zip(
            tokenizer.encode_batch(src_text), tokenizer.encode_batch(tgt_text), strict=True
        ):
            if len(s) > keep or len(t) > keep:
                n_over += 1
                if overlong == "drop":
                    n_seen += 1
                    continue
                s, t = s[:keep], t[:keep]
            src_parts.append(s)
            tgt_parts.append(t)
            src_lens.append(len(s) + 1)
            tgt_lens.append(len(t) + 1)
            index.append(n_seen)
            n_seen += 1
    if n_over:
        log.warning(
            "%s: %s %d of %d pairs longer than data.max_len=%d tokens (incl. EOS)",
            split,
            "dropped" if overlong == "drop" else "truncated",
            n_over,
            n_seen,
            cfg.max_len,
        )
    if not index:
        raise DataError(
            f"split {split!r}: no pair fits data.max_len={cfg.max_len}; raise it or set "
            f"data.overlong=truncate."
        )

    def flat(parts, lens):
        offsets = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        ids = np.full(offsets[-1], EOS_ID, np.int32)
        for p, start in zip(parts, offsets[:-1].tolist(), strict=True):
            ids[start : start + len(p)] = p
        return ids, offsets

    src_ids, src_off = flat(src_parts, src_lens)
    tgt_ids, tgt_off = flat(tgt_parts, tgt_lens)
    return TokenizedSplit(src_ids, src_off, tgt_ids, tgt_off, np.asarray(index, np.int64))
