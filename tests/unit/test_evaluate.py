"""BLEU wrappers against sacreBLEU, and the paper's tokenized, compound-split BLEU by hand."""

import math

import pytest
import sacrebleu

from tfm_jax.eval import metrics

HYPS = [
    "The cat sat on the mat.",
    "Der Auto-Hersteller meldete höhere Gewinne.",
    "It is a guide to action which ensures that the military always obeys the commands.",
]
REFS = [
    "The cat is sitting on the mat.",
    "Der Autohersteller meldete höhere Gewinne.",
    "It is a guide to action that ensures that the military will forever heed commands.",
]


def test_bleu_equals_sacrebleu():
    result = metrics.bleu(HYPS, REFS)
    expected = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert result["score"] == pytest.approx(expected.score)
    assert 0 < result["score"] < 100
    assert "tok:13a" in result["signature"] and "nrefs:1" in result["signature"]


def test_chrf_equals_sacrebleu():
    assert metrics.chrf(HYPS, REFS) == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert metrics.chrf(REFS, REFS) == pytest.approx(100.0)


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="one reference per hypothesis"):
        metrics.bleu(HYPS, REFS[:2])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Der Auto-Hersteller", "Der Auto ##AT##-##AT## Hersteller"),
        ("rich-text format", "rich ##AT##-##AT## text format"),
        # Moses splits the punctuation; a lone or spaced hyphen is no compound.
        ('Er sagte: "Hallo, Welt!"', 'Er sagte : " Hallo , Welt ! "'),
        ("von 9 - 17 Uhr", "von 9 - 17 Uhr"),
        # Non-overlapping matches, as in the Perl one-liner.
        ("a-b-c", "a ##AT##-##AT## b-c"),
    ],
)
def test_tokenize_for_paper_bleu(text, expected):
    assert metrics.tokenize_for_paper_bleu(text, "de") == expected


def test_paper_bleu_identical_is_100():
    assert metrics.paper_bleu(HYPS, HYPS, "de") == pytest.approx(100.0)


def test_paper_bleu_known_case():
    # Hand count after splitting (7 tokens each, brevity penalty 1):
    #   hyp: die neuen Auto ##AT##-##AT## Hersteller sind da
    #   ref: die neuen Auto ##AT##-##AT## Bauer sind da
    # 1-grams 6/7, 2-grams 4/6, 3-grams 2/5, 4-grams 1/4.
    hyp, ref = "die neuen Auto-Hersteller sind da", "die neuen Auto-Bauer sind da"
    expected = 100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25
    assert metrics.paper_bleu([hyp], [ref], "de") == pytest.approx(expected, rel=1e-6)
    # Without the split no 3-gram matches, so (unsmoothed, as multi-bleu.perl) BLEU is 0.
    assert sacrebleu.corpus_bleu(
        [hyp], [[ref]], tokenize="none", smooth_method="none", force=True
    ).score == pytest.approx(0.0)


def test_paper_bleu_brevity_penalty():
    # A 5-token prefix of a 7-token reference: all precisions 1, BP = exp(1 - 7/5).
    ref = "die neuen Hersteller sind heute da ."
    hyp = "die neuen Hersteller sind heute"
    expected = 100 * math.exp(1 - 7 / 5)
    assert metrics.paper_bleu([hyp], [ref], "de") == pytest.approx(expected, rel=1e-6)
