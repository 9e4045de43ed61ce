"""BPE-dropout (Provilkov et al. 2020): a sentencepiece BPE vocabulary's segmentation with each
candidate merge dropped at random, seeded, vectorized over every word of a split.

Why not sentencepiece's own sampling (`encode(..., enable_sampling=True, alpha=p)`): its random
generator does not follow `set_random_generator_seed` across processes (measured with
sentencepiece 0.2: the same seed gives another segmentation in every new process). A
resumed run or a second host must see exactly the batches of an uninterrupted run (the plan of
an epoch is a function of the pairs' lengths), so the merges are redone here with numpy's
seeded generator, from the vocabulary's own pieces and scores. With p = 0 it reproduces
sentencepiece's deterministic segmentation exactly (tested on Multi30k).

The algorithm is the paper's (Algorithm 1), per word: take every merge two adjacent symbols
allow (their concatenation is a piece), drop each with probability p, apply the one of highest
score (leftmost on ties, as sentencepiece); stop when none is left. Words are the spans
sentencepiece starts with "▁" (its pieces never cross one), so they come from its own
deterministic pieces and its whitespace handling is kept as is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfm_jax.data.plans import permute_segments
from tfm_jax.data.sources import DataError
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.vocab_ids import UNK_ID

_WORD_START = "\u2581"  # sentencepiece's whitespace mark
_LENGTH_GROUPS = (4, 8, 16, 32)  # words merged in groups of similar length (less padding)


class BpeDropout:
    """The words of `texts` once, and a fresh BPE-dropout segmentation of them per call."""

    def __init__(self, tokenizer: Tokenizer, texts: Sequence[str]):
        pieces, scores, mergeable = tokenizer.pieces()
        self.vocab_size = v = len(pieces)
        piece_id = {p: i for i, p in enumerate(pieces) if mergeable[i]}
        # Every merge: (left id, right id) -> the merged piece, ranked by its score.
        keys, merged = [], []
        for i, piece in enumerate(pieces):
            if not mergeable[i]:
                continue
            for k in range(1, len(piece)):
                a, b = piece_id.get(piece[:k]), piece_id.get(piece[k:])
                if a is not None and b is not None:
                    keys.append(a * v + b)
                    merged.append(i)
        keys.append(-1)  # a key no pair has: the table is never empty
        merged.append(0)
        order = np.argsort(np.asarray(keys, np.int64), kind="stable")
        self._keys = np.asarray(keys, np.int64)[order]
        self._merged = np.asarray(merged, np.int32)[order]
        self._rank = -np.asarray(scores, np.float64)[self._merged]  # lower = merged first

        # Each text's words (occurrences), as indices into its distinct words.
        word_index: dict[str, int] = {}
        occurrences, self.num_texts = [], len(texts)
        words_per_text = np.zeros(len(texts), np.int64)
        for t, text_pieces in enumerate(tokenizer.encode_pieces_batch(texts)):
            first = len(occurrences)
            word = None
            for piece in text_pieces:
                if word is None or piece.startswith(_WORD_START):
                    if word is not None:
                        occurrences.append(word_index.setdefault(word, len(word_index)))
                    word = piece
                else:
                    word += piece
            if word is not None:
                occurrences.append(word_index.setdefault(word, len(word_index)))
            words_per_text[t] = len(occurrences) - first
        self._text_of = np.repeat(np.arange(len(texts)), words_per_text)  # each occurrence's
        self._occurrences = np.asarray(occurrences, np.int64)
        distinct = list(word_index)
        lens = np.fromiter(map(len, distinct), np.int64, len(distinct))
        width = int(lens.max()) if len(lens) else 1
        chars = np.full((len(distinct), width), -1, np.int32)  # each word's characters' ids
        for w, word in enumerate(distinct):
            chars[w, : len(word)] = [piece_id.get(c, UNK_ID) for c in word]
        self._chars, self._word_len = chars, lens
        check = min(len(texts), 200)
        if self.sample(0.0, np.random.default_rng(0))[:check] != tokenizer.encode_batch(
            texts[:check]
        ):
            raise DataError(
                f"data.bpe_dropout: the vocabulary {tokenizer.path or '(in memory)'} does not "
                "segment as BPE merges by score would (a unigram sentencepiece model?). "
                "BPE-dropout needs a BPE model: unset data.vocab_path to train one, or set "
                "data.bpe_dropout=0."
            )

    def sample(self, p: float, rng: np.random.Generator) -> list[list[int]]:
        """Each text's ids under BPE-dropout with probability `p` (p = 0: the deterministic
        segmentation), drawn from `rng` alone."""
        lens = self._word_len[self._occurrences]
        flats, counts, members = [], [], []
        longest = int(lens.max(initial=1))
        bounds = [0, *[b for b in _LENGTH_GROUPS if b < longest], longest]
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            group = np.flatnonzero((lens > lo) & (lens <= hi))
            if not len(group):
                continue
            symbols = self._merge(self._chars[self._occurrences[group], :hi].copy(), p, rng)
            keep = symbols >= 0
            # Runs of unknown characters are one <unk>, as sentencepiece encodes them.
            repeat = (symbols[:, 1:] == UNK_ID) & (symbols[:, :-1] == UNK_ID)
            keep[:, 1:] &= ~repeat
            flats.append(symbols[keep])
            counts.append(keep.sum(1))
            members.append(group)
        if not flats:
            return [[] for _ in range(self.num_texts)]
        flat, count = np.concatenate(flats), np.concatenate(counts)
        flat, count = permute_segments(flat, count, np.argsort(np.concatenate(members)))
        per_text = np.bincount(self._text_of, weights=count, minlength=self.num_texts)
        per_text = per_text.astype(np.int64)
        return [ids.tolist() for ids in np.split(flat, np.cumsum(per_text)[:-1])]

    def _merge(self, symbols: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
        """Applies merges to every row of `symbols` (ids, -1 padded) until none is left."""
        rows = np.arange(len(symbols))
        width = symbols.shape[1]
        while len(rows) and width > 1:
            a = symbols[rows]
            left, right = a[:, :-1].astype(np.int64), a[:, 1:]
            key = left * self.vocab_size + right
            at = np.minimum(np.searchsorted(self._keys, key), len(self._keys) - 1)
            ok = (self._keys[at] == key) & (left >= 0) & (right >= 0)
            if p > 0:
                ok &= rng.random(ok.shape) >= p
            best = np.where(ok, self._rank[at], np.inf).argmin(1)
            merging = ok[np.arange(len(rows)), best]
            rows, best, at = rows[merging], best[merging], at[merging]
            if not len(rows):
                break
            merged = symbols[rows]
            merged[np.arange(len(rows)), best] = self._merged[at[np.arange(len(rows)), best]]
            # Drop column best + 1: the symbols after it shift left by one.
            col = np.arange(width - 1)[None, :]
            src = col + (col > best[:, None])
            merged[:, :-1] = np.take_along_axis(merged, src, 1)
            merged[:, -1] = -1
            symbols[rows] = merged
        return symbols
