"""Scores a split (§6): decode it, write the hypotheses, score them with sacreBLEU, chrF and the
paper's tokenized BLEU, beside the references' perplexity; several length penalties at once.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence

import jax
import ml_collections

from tfm_jax import data
from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.decode import search, translate
from tfm_jax.eval import metrics
from tfm_jax.model import losses, scoring
from tfm_jax.model.transformer import Transformer
from tfm_jax.platform import storage


def resolve_split(cfg: ml_collections.ConfigDict, name: str) -> str:
    """Maps "validation" -> data.eval_split, "test" -> data.test_split, anything else as is."""
    return {"validation": cfg.data.eval_split, "test": cfg.data.test_split}.get(name, name)


def ensemble_eval_step(params, batch, *, models, label_smoothing: float):
    """scoring.eval_step's sums for an ensemble: the loss of the members' mean probability, the
    distribution its beam search follows (decode/search.ensemble_tokens_to_logits)."""
    mean = search.mean_probability_logits([
        scoring.model_forward(m, p, batch, deterministic=True)
        for m, p in zip(models, params, strict=True)
    ])  # fmt: skip
    return losses.cross_entropy_sums(mean, batch["targets"], label_smoothing)


def perplexity(cfg, model, params, tokenizer, split: str) -> dict[str, float]:
    """Per-token NLL and perplexity of the references (teacher forcing), as in Table 3: the
    training loop's own implementation (scoring.perplexity) over the model being decoded, or
    over an ensemble's mean probability when `model` and `params` are sequences."""
    models, params = translate.as_members(model, params)
    smoothing = cfg.loss.label_smoothing
    if len(models) == 1:
        step = functools.partial(scoring.eval_step, model=models[0], label_smoothing=smoothing)
        params = params[0]
    else:
        step = functools.partial(ensemble_eval_step, models=models, label_smoothing=smoothing)
    batches = data.make_eval_batches(cfg.data, tokenizer, split)
    return scoring.perplexity(jax.jit(step), params, batches)


def _alpha_name(alpha: float) -> str:
    return f"{alpha:g}"


def evaluate_split(
    cfg: ml_collections.ConfigDict,
    model: Transformer | Sequence[Transformer],
    params,
    tokenizer: Tokenizer,
    split: str,
    *,
    workdir: str,
    alphas: Sequence[float] | None = None,
    out_dir: str | None = None,
    checkpoint_name: str = "averaged",
    greedy: bool = False,
    members: Sequence[dict] = (),
) -> dict:
    """Decodes `split`, scores it and writes hypotheses and scores.json under out_dir.

    `split` may be "validation" / "test" (cfg.data.eval_split / test_split) or a split name.
    alphas default to (cfg.decode.alpha,). With several, each is decoded and scored under
    "by_alpha" and the top-level scores are the best alpha's by sacreBLEU: choose alpha on the
    validation split, as the paper did (§6.1), not on the test split.
    Out_dir defaults to <workdir>/eval/<checkpoint_name>.
    `model` and `params` may be an ensemble's (decode/translate.py); `members` then describes
    them ({"workdir", "checkpoint"} each), recorded in scores.json as "ensemble"; a single
    model's parameter count is recorded as "params".
    """
    alphas = tuple(alphas) if alphas else (cfg.decode.alpha,)
    name = resolve_split(cfg, split)
    out_dir = out_dir or storage.join(workdir, "eval", str(checkpoint_name))
    storage.makedirs(out_dir)
    sources, refs = data.load_split_texts(cfg.data, name)
    ppl = perplexity(cfg, model, params, tokenizer, name)

    by_alpha = {}
    for alpha in alphas:
        start = time.perf_counter()
        hyps = translate.translate_texts(
            cfg, model, params, tokenizer, sources, alpha=alpha, greedy=greedy
        )
        seconds = time.perf_counter() - start
        suffix = f".alpha{_alpha_name(alpha)}" if len(alphas) > 1 else ""
        hyp_file = storage.join(out_dir, f"{name}{suffix}.hyp.txt")
        storage.write_text(hyp_file, "".join(h + "\n" for h in hyps))
        sacre = metrics.bleu(hyps, refs)
        by_alpha[_alpha_name(alpha)] = {
            "alpha": alpha,
            "bleu": sacre["score"],
            "bleu_signature": sacre["signature"],
            "chrf": metrics.chrf(hyps, refs),
            "bleu_tok_compound": metrics.paper_bleu(hyps, refs, cfg.data.target_lang),
            # Wall time of translate_texts, compilation included (one compile per shape).
            "sentences_per_s": len(sources) / seconds,
            "hyp_file": hyp_file,
        }
    best = max(by_alpha, key=lambda a: by_alpha[a]["bleu"])
    scores = {k: v for k, v in by_alpha[best].items() if k != "alpha"}
    scores.update(
        nll=ppl["nll"],
        ppl=ppl["ppl"],
        decode={
            "beam_size": 1 if greedy else cfg.decode.beam_size,
            "alpha": by_alpha[best]["alpha"],
            "max_extra_len": cfg.decode.max_extra_len,
            "first_pass_extra_len": cfg.decode.first_pass_extra_len,
            "greedy": greedy,
        },
        split=name,
        split_requested=split,
        checkpoint=str(checkpoint_name),
        workdir=workdir,
        num_sentences=len(sources),
        target_lang=cfg.data.target_lang,
    )
    if members:
        scores["ensemble"] = [dict(m) for m in members]
    else:  # the model's size, read off the params evaluated (Table 3's column)
        scores["params"] = scoring.size_of(params)
    if len(alphas) > 1:
        scores["by_alpha"] = by_alpha
        scores["alpha_selection"] = (
            f"top-level scores are alpha={best}, the best sacreBLEU on split {name!r}"
        )
    if len(alphas) > 1:  # the best alpha's hypotheses also under the plain name
        best_file = storage.read_bytes(by_alpha[best]["hyp_file"])
        storage.write_bytes(storage.join(out_dir, f"{name}.hyp.txt"), best_file)
    storage.write_text(storage.join(out_dir, "scores.json"), json.dumps(scores, indent=2))
    return scores
