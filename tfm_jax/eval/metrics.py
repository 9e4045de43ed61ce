"""§6.1 BLEU: sacreBLEU (primary, detokenized) and the paper's tokenized, compound-split BLEU.

The paper's numbers come from tensor2tensor's get_ende_bleu.sh: Moses tokenizer.perl on both
hypotheses and references, hyphenated compounds split into `a ##AT##-##AT## b`, then
multi-bleu.perl. Those scores depend on that tokenization and are not comparable to sacreBLEU;
report both (sacreBLEU with its signature).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import sacrebleu

# get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'. Non-overlapping like the
# Perl original, so "a-b-c" becomes "a ##AT##-##AT## b-c"; kept as is for comparability.
_COMPOUND = re.compile(r"(\S)-(\S)")


def _check_lengths(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(
            f"got {len(hyps)} hypotheses and {len(refs)} references; "
            "pass one reference per hypothesis, in the same order"
        )


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, float | str]:
    """Corpus sacreBLEU on detokenized text (13a tokenizer, defaults otherwise).

    Returns {"score": float in [0, 100], "signature": str}, the signature to be reported with it.
    """
    _check_lengths(hyps, refs)
    metric = sacrebleu.metrics.BLEU()
    score = metric.corpus_score(list(hyps), [list(refs)])
    return {"score": score.score, "signature": str(metric.get_signature())}


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus chrF (sacreBLEU defaults), in [0, 100]."""
    _check_lengths(hyps, refs)
    return sacrebleu.metrics.CHRF().corpus_score(list(hyps), [list(refs)]).score


@functools.lru_cache(maxsize=8)
def _moses(lang: str):
    """sacremoses' tokenizer, imported here: its import compiles its patterns (~0.25 s), which
    only the paper-style BLEU needs, not every command that imports this module."""
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


def tokenize_for_paper_bleu(text: str, lang: str) -> str:
    """Moses-tokenizes `text` and splits hyphenated compounds, as get_ende_bleu.sh does.

    escape=False: tokenizer.perl escapes by default (`"` -> `&quot;`), but escaping maps tokens
    one to one on both sides and cannot create hyphens, so BLEU is the same and the text stays
    readable.
    """
    tokenized = _moses(lang).tokenize(text, return_str=True, escape=False)
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def paper_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str) -> float:
    """Tokenized, compound-split corpus BLEU, as in the paper's Table 2 (get_ende_bleu.sh).

    multi-bleu.perl on pre-tokenized text is sacreBLEU with no tokenization, case-sensitive and
    no smoothing (a zero n-gram precision gives 0, as in multi-bleu.perl).
    """
    _check_lengths(hyps, refs)
    hyps_tok = [tokenize_for_paper_bleu(h, lang) for h in hyps]
    refs_tok = [tokenize_for_paper_bleu(r, lang) for r in refs]
    # force=True: sacreBLEU otherwise warns that the input looks tokenized, which it is on purpose.
    return sacrebleu.corpus_bleu(
        hyps_tok, [refs_tok], tokenize="none", smooth_method="none", force=True
    ).score
