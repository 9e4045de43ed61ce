"""Inference: cached beam search == full recompute, batching invariance, CLI round trips."""

import argparse
import functools
import glob
import io
import json
import os
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REPO, process_env, tiny_config
from jax import lax

from tfm_jax import data
from tfm_jax.checkpoint import averaging
from tfm_jax.checkpoint.manager import Checkpointer
from tfm_jax.cli import inference as inference_cli
from tfm_jax.config.build import split_overrides
from tfm_jax.decode import load, search, translate
from tfm_jax.model import scoring
from tfm_jax.model.transformer import Transformer
from tfm_jax.train.trainer import make_trainer
from tfm_jax.viz.attention import capture_attention
from tfm_jax.vocab_ids import BOS_ID, EOS_ID

# ----------------------------------------------------------------------------- cached == full


def full_recompute_tokens_to_logits(model, params, encoded, inputs):
    """Slow reference: the "cache" is the prefix so far; every step reruns the whole decoder."""

    def tokens_to_logits(ids, cache):
        idx = cache["index"]
        prefix = lax.dynamic_update_slice(cache["prefix"], ids, (0, idx))  # [rows, T]
        logits = model.apply(
            {"params": params}, encoded, inputs, prefix, method=Transformer.decode
        )  # [rows, T, vocab]; teacher forcing, causal mask, PAD after idx masked out
        step = lax.dynamic_index_in_dim(logits, idx, axis=1, keepdims=False)
        return translate.mask_special_logits(step), {"prefix": prefix, "index": idx + 1}

    return tokens_to_logits


@functools.partial(jax.jit, static_argnames=("model", "cached", "max_decode_len"))
def run_beam(params, inputs, max_lengths, *, model, cached, max_decode_len):
    rows = inputs.shape[0]
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
    enc_b, in_b = search.expand_to_beams((encoded, inputs), 4)
    if cached:
        fn = translate.cached_tokens_to_logits(model, params, enc_b, in_b)
        cache = translate.init_cache(model, params, encoded, inputs, max_decode_len)
    else:
        fn = full_recompute_tokens_to_logits(model, params, enc_b, in_b)
        cache = {
            "prefix": jnp.zeros((rows, max_decode_len), jnp.int32),
            "index": jnp.array(0, jnp.int32),
        }
    return search.beam_search(
        fn, cache, batch_size=rows, max_decode_len=max_decode_len, max_lengths=max_lengths,
        beam_size=4, alpha=0.6,
    )[:2]  # fmt: skip


@pytest.fixture(scope="module")
def random_model():
    cfg = tiny_config(**{"model.dropout": 0.0})
    model = scoring.make_model(cfg)
    src = jnp.ones((1, 8), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(3), src, src)["params"]
    return cfg, model, nn.unbox(params)


def check_cached_equals_full(cfg, model, params, lengths, max_extra_len=6):
    """Beam 4 with the KV cache == with the whole decoder rerun on the prefix; returns seqs."""
    rng = np.random.default_rng(0)
    vocab = cfg.model.vocab_size
    inputs = np.zeros((len(lengths), max(lengths) + 1), np.int32)
    for r, n in enumerate(lengths):
        inputs[r, : n - 1] = rng.integers(4, vocab, n - 1)
        inputs[r, n - 1] = EOS_ID
    max_lengths = np.array(lengths) + max_extra_len
    kw = dict(model=model, max_decode_len=max(lengths) + max_extra_len + 1)
    fast_seqs, fast_scores = run_beam(params, inputs, max_lengths, cached=True, **kw)
    slow_seqs, slow_scores = run_beam(params, inputs, max_lengths, cached=False, **kw)
    seqs = np.asarray(fast_seqs)
    np.testing.assert_array_equal(seqs, np.asarray(slow_seqs))
    np.testing.assert_allclose(np.asarray(fast_scores), np.asarray(slow_scores), rtol=1e-5)
    # The pipeline (bucketed batch, dummy rows, jitted _search) returns the same best beams.
    sources = [list(inputs[r, : n - 1]) for r, n in enumerate(lengths)]
    out = translate.translate_ids(
        cfg, model, params, sources, beam_size=4, alpha=0.6, max_extra_len=max_extra_len
    )
    for b, o in enumerate(out):
        best = seqs[b, 0]
        end = np.flatnonzero(best == EOS_ID)
        np.testing.assert_array_equal(o, best[: end[0] + 1] if len(end) else best[: max_lengths[b]])
    return seqs, max_lengths


def test_cached_beam_search_equals_full_recompute(random_model):
    cfg, model, params = random_model
    seqs, _ = check_cached_equals_full(cfg, model, params, [3, 7, 5, 2])
    assert len({tuple(s) for s in seqs.reshape(-1, seqs.shape[-1])}) > 3  # distinct beams


def test_plan_batches_shapes(random_model):
    cfg = tiny_config(**{"decode.tokens_per_batch": 64})
    lengths = [3, 20, 5, 17, 2, 40, 4, 6, 9]
    plan = translate.plan_batches(cfg, lengths)
    assert sorted(i for chunk, _, _ in plan for i in chunk) == list(range(len(lengths)))
    # Buckets of padded lengths 16, 32 and 48 (<= model.max_len); 64 // 16 = 4 rows, 64 // 32 = 2.
    assert [(len(c), rows, s) for c, rows, s in plan] == [(4, 4, 16), (2, 2, 16), (2, 2, 32),
                                                          (1, 1, 48)]  # fmt: skip
    for chunk, _, src_len in plan:
        assert all(lengths[i] <= src_len for i in chunk)


# ----------------------------------------------------------------------------- ensembles


def test_ensemble_of_a_model_with_itself_decodes_as_the_model(random_model):
    cfg, model, params = random_model
    sources = [[5, 9, 12], [7], [30, 31, 32, 33, 34, 35], [4, 4]]
    one = translate.translate_ids(cfg, model, params, sources, max_extra_len=6)
    two = translate.translate_ids(cfg, (model, model), (params, params), sources, max_extra_len=6)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)


def test_ensemble_follows_the_mean_of_its_members_probabilities(random_model):
    """Members of different shapes; greedy ensemble decoding (cached) takes, at every step, the
    argmax of the members' mean probability under a full teacher-forced recompute."""
    cfg, model, params = random_model
    other_cfg = tiny_config(**{"model.dropout": 0.0, "model.num_layers": 1, "model.d_ff": 48})
    other = scoring.make_model(other_cfg)
    src = jnp.ones((1, 8), jnp.int32)
    other_params = nn.unbox(jax.jit(other.init)(jax.random.PRNGKey(11), src, src)["params"])
    models, both = (model, other), (params, other_params)
    sources = [[5, 9, 12], [7, 8], [30, 31, 32, 33, 34]]
    outs = translate.translate_ids(cfg, models, both, sources, max_extra_len=5, greedy=True)
    singles = [translate.translate_ids(cfg, m, p, sources, max_extra_len=5, greedy=True)
               for m, p in zip(models, both, strict=True)]  # fmt: skip
    assert any(
        not all(np.array_equal(o, s[i]) for s in singles) for i, o in enumerate(outs)
    )  # the ensemble's outputs are not simply one member's
    # Teacher forcing on the outputs, all sentences in one padded batch (PAD keys are masked,
    # and causal attention keeps the padding after a sentence out of its earlier positions).
    inputs = np.zeros((len(sources), 8), np.int32)
    prefix = np.zeros((len(sources), 16), np.int32)
    for r, (ids, out) in enumerate(zip(sources, outs, strict=True)):
        inputs[r, : len(ids) + 1] = [*ids, EOS_ID]
        prefix[r, : len(out)] = [BOS_ID, *out[:-1]]
    probs = np.asarray(mean_probability(both, inputs, prefix, models=models))
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(np.argmax(probs[r, : len(out)], -1), out)


@functools.partial(jax.jit, static_argnames=("models",))
def mean_probability(params, inputs, prefix, *, models):
    """The members' mean next-token probability at every position of `prefix` (full forward)."""
    probs = 0.0
    for m, p in zip(models, params, strict=True):
        encoded = m.apply({"params": p}, inputs, method=Transformer.encode)
        logits = m.apply({"params": p}, encoded, inputs, prefix, method=Transformer.decode)
        probs += jax.nn.softmax(translate.mask_special_logits(logits).astype(jnp.float32))
    return probs / len(models)


def test_ensemble_perplexity_is_of_the_mean_probability(random_model):
    from tfm_jax.eval import evaluate

    cfg, model, params = random_model
    rng = np.random.default_rng(1)
    other_params = jax.tree.map(  # another model: the same weights, perturbed
        lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(x.dtype), params
    )
    targets = rng.integers(4, cfg.model.vocab_size, (3, 7)).astype(np.int32)
    targets[0, 5:] = 0  # padding
    batch = {"inputs": jnp.asarray(rng.integers(4, 64, (3, 6)), jnp.int32),
             "targets": jnp.asarray(targets)}  # fmt: skip
    step = jax.jit(functools.partial(evaluate.ensemble_eval_step, models=(model, model),
                                     label_smoothing=0.0))  # fmt: skip
    sums = step((params, other_params), batch)
    forward = jax.jit(lambda p: jax.nn.softmax(scoring.model_forward(model, p, batch,
                                                                  deterministic=True)))  # fmt: skip
    probs = [np.asarray(forward(p), float) for p in (params, other_params)]
    label_p = [np.take_along_axis(q, targets[..., None], -1)[..., 0] for q in probs]
    mask = targets != 0
    expected = -np.log((label_p[0] + label_p[1]) / 2)[mask].sum()
    np.testing.assert_allclose(float(sums["nll"]), expected, rtol=1e-5)
    assert float(sums["tokens"]) == mask.sum()
    # Jensen: the mixture's NLL is at most the members' mean NLL.
    assert expected <= np.mean([-np.log(q)[mask].sum() for q in label_p])


# ----------------------------------------------------------------------------- a trained run

EN = "one two three four five six seven eight nine ten".split()
DE = "eins zwei drei vier fuenf sechs sieben acht neun zehn".split()


def _corpus(n, seed):
    rng = np.random.default_rng(seed)
    src, tgt = [], []
    for _ in range(n):
        idx = rng.integers(0, 10, rng.integers(1, 6))
        src.append(" ".join(EN[i] for i in idx))
        tgt.append(" ".join(DE[i] for i in idx))
    return src, tgt


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny model trained 30 steps on a number-word copy task, checkpointed and averaged."""
    folder = tmp_path_factory.mktemp("numbers")
    for split, n, seed in (("train", 300, 0), ("val", 12, 1)):
        for lang, lines in zip(("en", "de"), _corpus(n, seed), strict=True):
            (folder / f"{split}.{lang}").write_text("".join(s + "\n" for s in lines))
    workdir = str(tmp_path_factory.mktemp("run"))
    cfg = tiny_config(**{
        "data.dir": str(folder), "data.eval_split": "val", "data.test_split": "val",
        "data.tokens_per_batch": 512, "data.num_buckets": 1, "data.num_workers": 1,
        "model.dropout": 0.0, "optim.warmup_steps": 20, "decode.tokens_per_batch": 64,
    })  # fmt: skip
    tokenizer = data.get_tokenizer(cfg.data, workdir)
    trainer = make_trainer(cfg)
    state = trainer.init_state(0)
    batches = data.make_train_iterator(cfg.data, tokenizer, seed=0)
    with Checkpointer(workdir, every_steps=0, every_secs=0, keep=3, async_save=False) as ckpt:
        for step in range(1, 31):
            state, _ = trainer.train_step(state, next(batches))
            if step in (20, 30):
                ckpt.maybe_save(step, state, batches.get_state(), cfg.to_json(), force=True)
    averaging.average_checkpoints(workdir, 2, trainer.abstract_state.params)
    return cfg, workdir


@pytest.fixture(scope="module")
def loaded(run):
    cfg, workdir = run
    return (cfg, *load.load_for_inference(workdir, "latest", cfg))


def cli(argv, monkeypatch=None, stdin=None):
    """Runs a command as `python -m tfm_jax ...` would once __main__ calls add_commands."""
    argv, overrides = split_overrides(argv)
    parser = argparse.ArgumentParser()
    inference_cli.add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return args.fn(args, overrides)


def test_translate_texts_order_empty_lines_and_batch_independence(loaded, caplog):
    cfg, model, params, tokenizer = loaded
    texts = ["one two", "", "three four five six", "seven", "  ", "eight nine ten one two",
             "two", "five five", "one two"]  # fmt: skip
    first = translate.DecodeStats()
    out = translate.translate_texts(cfg, model, params, tokenizer, texts, stats=first)
    assert len(out) == len(texts)
    assert out[1] == "" and out[4] == ""
    assert out[0] == out[-1]  # a repeated line
    assert any(w in o.split() for o in out for w in DE)  # 30 steps: it learned a few words
    second = translate.DecodeStats()
    again = translate.translate_texts(cfg, model, params, tokenizer, texts[::-1], stats=second)
    assert again[::-1] == out
    assert first.programs and second.programs <= first.programs  # same shapes: no new program
    # Other batch compositions (3 sentences + a dummy row, in another order): same outputs.
    some = [texts[5], texts[0], texts[2]]
    assert translate.translate_texts(cfg, model, params, tokenizer, some) == [
        out[5],
        out[0],
        out[2],
    ]
    # A line over the model's limit is truncated (with a warning), not an error.
    with caplog.at_level("WARNING"):
        (long_out,) = translate.translate_texts(cfg, model, params, tokenizer, [" ".join(EN * 20)])
    assert isinstance(long_out, str) and "Truncated 1 source line" in caplog.text


def test_two_pass_decoding_equals_one_full_pass(loaded, monkeypatch):
    """decode.first_pass_extra_len: a short first buffer, then the full length for the sentences
    it cut off, gives exactly the one-pass outputs."""
    cfg, model, params, tokenizer = loaded
    # Sources padded to multiples of 4, not 16, so that a first buffer of padded length + 1 cuts
    # some outputs (6 of the 13 here); unpadded (1), each length compiled alone, took twice as long.
    monkeypatch.setattr(translate, "SRC_LEN_MULTIPLE", 4)
    rng = np.random.default_rng(5)
    # Real sentences and random ids: outputs of several lengths, some longer than source + 1.
    sources = tokenizer.encode_batch(_corpus(8, seed=7)[0])
    sources += [rng.integers(4, cfg.model.vocab_size, n).tolist() for n in (3, 3, 7, 7, 7)]
    outputs = {}
    for extra in (0, 1):
        c = cfg.copy_and_resolve_references()
        c.decode.max_extra_len, c.decode.first_pass_extra_len = 40, extra
        stats = translate.DecodeStats()
        outputs[extra] = translate.translate_ids(c, model, params, sources, stats=stats)
        redone = stats.redecoded
        assert redone == 0 if extra == 0 else 0 < redone < len(sources), (extra, redone)
    for a, b in zip(outputs[1], outputs[0], strict=True):
        np.testing.assert_array_equal(a, b)


def test_translate_cli_round_trip(run, tmp_path, monkeypatch, capsys):
    cfg, workdir = run
    lines = ["one two three", "", "four", "ten nine eight seven", "", "six"]
    src = tmp_path / "in.txt"
    src.write_text("".join(s + "\n" for s in lines))
    dst = tmp_path / "out.txt"
    rc = cli(["translate", f"--workdir={workdir}", f"--input={src}", f"--output={dst}"])
    assert rc == 0
    got = dst.read_text().split("\n")
    assert got[-1] == "" and len(got) - 1 == len(lines)
    # empty lines stay empty (a 30-step model may also emit EOS first for a real line)
    assert all(g == "" for g, s in zip(got[:-1], lines, strict=False) if s == "")
    # Default checkpoint is the averaged one; compare with the library on it.
    model, params, tokenizer = load.load_for_inference(workdir, "averaged", cfg)
    assert got[:-1] == translate.translate_texts(cfg, model, params, tokenizer, lines)
    # stdin -> stdout, a config override, another checkpoint.
    capsys.readouterr()
    stdin = "".join(s + "\n" for s in lines)
    argv = ["translate", f"--workdir={workdir}", "--checkpoint=20", "--config.decode.alpha=0.6"]
    rc = cli(argv, monkeypatch, stdin=stdin)
    assert rc == 0
    out = capsys.readouterr().out.split("\n")
    assert len(out) - 1 == len(lines) and out[1] == "" and out[4] == ""


@pytest.mark.multiprocess
def test_translate_on_two_cpu_devices_matches_one(run, tmp_path):
    """`--cpu_devices=2` (a fresh process: the device count is fixed when JAX starts) spreads
    the batches over two CPU devices; the translations are those of one device."""
    cfg, workdir = run
    texts = [" ".join(s.split()[:k]) for k, s in enumerate(_corpus(24, seed=9)[0] * 2, 1)]
    src = tmp_path / "in.txt"
    src.write_text("".join(t + "\n" for t in texts))
    dst = tmp_path / "out.txt"
    env = process_env()
    env.pop("JAX_NUM_CPU_DEVICES", None)
    script = (
        "import sys, jax; from tfm_jax.cli.main import main; rc = main(sys.argv[1:]); "
        "assert jax.local_device_count() == 2, jax.devices(); sys.exit(rc)"
    )
    argv = ["translate", f"--workdir={workdir}", f"--input={src}", f"--output={dst}",
            "--cpu_devices=2", "--config.decode.tokens_per_batch=32"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True,
                          text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = cfg.copy_and_resolve_references()
    cfg.decode.tokens_per_batch = 32  # several batches, so both devices get some
    model, params, tokenizer = load.load_for_inference(workdir, "averaged", cfg)
    assert jax.local_device_count() == 1
    expected = translate.translate_texts(cfg, model, params, tokenizer, texts)
    assert dst.read_text().split("\n")[:-1] == expected


def test_cli_errors_are_messages(run, tmp_path, capsys):
    _, workdir = run
    assert cli(["translate", f"--workdir={tmp_path / 'nope'}"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert cli(["translate", f"--workdir={workdir}", f"--input={tmp_path / 'x.txt'}"]) == 1
    assert "input file" in capsys.readouterr().err
    assert cli(["translate", f"--workdir={workdir}", "--checkpoint=7"]) == 1
    err = capsys.readouterr().err
    assert "step 7" in err and "20" in err and "30" in err
    assert cli(["translate", f"--workdir={workdir}", "--config.decode.beam_sise=2"]) == 2
    assert "beam_size" in capsys.readouterr().err


def test_evaluate_writes_scores(run, capsys):
    cfg, workdir = run
    capsys.readouterr()
    rc = cli(["evaluate", f"--workdir={workdir}", "--split=validation", "--checkpoint=latest",
              "--alphas=0.6,1.0"])  # fmt: skip
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    out_dir = os.path.join(workdir, "eval", "latest")
    with open(os.path.join(out_dir, "scores.json")) as f:
        scores = json.load(f)
    assert scores == printed
    keys = (
        "bleu", "bleu_signature", "chrf", "bleu_tok_compound", "nll", "ppl", "sentences_per_s",
        "decode", "split", "checkpoint", "num_sentences", "by_alpha",
    )  # fmt: skip
    assert set(keys) <= set(scores), set(keys) - set(scores)
    assert scores["split"] == "val" and scores["num_sentences"] == 12
    assert scores["checkpoint"] == "latest"
    assert set(scores["by_alpha"]) == {"0.6", "1"}
    assert scores["bleu"] == max(a["bleu"] for a in scores["by_alpha"].values())
    assert scores["ppl"] == pytest.approx(np.exp(scores["nll"]))
    assert scores["decode"]["beam_size"] == cfg.decode.beam_size
    assert scores["params"] == scoring.count_params(cfg) > 0  # `params`'s count, from the weights
    for name in ("val.hyp.txt", "val.alpha0.6.hyp.txt", "val.alpha1.hyp.txt"):
        with open(os.path.join(out_dir, name)) as f:
            assert len(f.read().split("\n")) == 13


def test_evaluate_an_ensemble_cli(run, tmp_path, capsys):
    """`evaluate --ensemble=OTHER`: both runs decode together, scores.json names the members
    and goes to its own folder; a member with another vocabulary is a one-line error."""
    cfg, workdir = run
    twin = tmp_path / "twin"
    shutil.copytree(workdir, twin, ignore=shutil.ignore_patterns("eval"))
    capsys.readouterr()
    argv = ["evaluate", f"--workdir={workdir}", "--split=validation", "--checkpoint=latest"]
    assert cli(argv) == 0
    single = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli([*argv, f"--ensemble={twin}"]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["ensemble"] == [
        {"workdir": workdir, "checkpoint": "latest"},
        {"workdir": str(twin), "checkpoint": "latest"},
    ]
    # The same weights twice: the ensemble's mean probability is the model's own.
    assert scores["bleu"] == single["bleu"]
    assert scores["nll"] == pytest.approx(single["nll"], rel=1e-5)
    out_dir = os.path.dirname(scores["hyp_file"])
    assert os.path.basename(out_dir).startswith("ensemble2_")
    with open(os.path.join(out_dir, "scores.json")) as f:
        assert json.load(f) == scores
    # Another vocabulary (trained on other text, same size) in the second member.
    other_text = tmp_path / "other"
    other_text.mkdir()
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    for lang in ("en", "de"):
        (other_text / f"train.{lang}").write_text(
            "".join(" ".join(words[i:] + words[:i]) + "\n" for i in range(10)) * 20
        )
    other_cfg = cfg.copy_and_resolve_references()
    other_cfg.data.dir = str(other_text)
    other_vocab = data.get_tokenizer(other_cfg.data, str(tmp_path / "vocab_run")).path
    (model_file,) = glob.glob(str(twin / "vocab" / "*.model"))
    shutil.copyfile(other_vocab, model_file)
    assert cli([*argv, f"--ensemble={twin}"]) == 1
    err = capsys.readouterr().err
    assert "another vocabulary" in err and str(twin) in err and "Traceback" not in err
    assert cli([*argv, f"--ensemble={tmp_path / 'nope'}"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_attention_capture_and_plots(run, loaded, tmp_path, capsys):
    _, workdir = run
    cfg, model, params, _ = loaded
    src = np.array([[5, 9, 12, EOS_ID]], np.int32)
    tgt = np.array([[7, 8, 6, 10, EOS_ID]], np.int32)
    logits, weights = capture_attention(model, params, src, tgt)
    assert len(weights) == 3 * cfg.model.num_layers
    dec = weights["decoder_1/self_attention"][0]  # [h, q, k]
    np.testing.assert_allclose(dec.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(dec, 1) == 0)  # causal
    assert weights["decoder_0/cross_attention"].shape == (1, 4, 5, 4)
    # The interceptor returns the clone's output: logits are unchanged by capturing.
    plain = np.asarray(model.apply({"params": params}, src, tgt))
    np.testing.assert_allclose(logits, plain, atol=1e-5)
    capsys.readouterr()
    rc = cli(["attention", f"--workdir={workdir}", "--text=one two three", "--layers=-1",
              "--heads=0,2", f"--out={tmp_path}"])  # fmt: skip
    assert rc == 0
    files = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["files"]
    assert sorted(os.path.basename(f) for f in files) == [
        "dec_self_layer1.png",
        "enc_dec_layer1.png",
        "enc_self_layer1.png",
    ]
    for f in files:
        with open(f, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
