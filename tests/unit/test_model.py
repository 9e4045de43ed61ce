"""Attention and the Transformer against numpy, masks as properties, cache == full forward."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfm_jax.decode import load, translate
from tfm_jax.eval import evaluate
from tfm_jax.model import attention
from tfm_jax.model.embeddings import sinusoidal_table
from tfm_jax.model.transformer import Transformer, shift_right, stack_layers, unstack_layers
from tfm_jax.vocab_ids import BOS_ID, EOS_ID, PAD_ID


def numpy_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d_k)) v in float64, masked keys excluded; fully masked rows -> 0."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    mask = np.broadcast_to(np.asarray(mask), scores.shape)
    out = np.zeros(q.shape[:3] + (v.shape[-1],))
    for b, h, i in np.ndindex(*scores.shape[:3]):
        keep = mask[b, h, i]
        if not keep.any():
            continue
        s = scores[b, h, i][keep]
        w = np.exp(s - s.max())
        w /= w.sum()
        out[b, i, h] = w @ v[b, keep, h]
    return out


def test_attention_matches_numpy_with_masks():
    rng = np.random.default_rng(0)
    b, lq, lk, h, dk, dv = 2, 5, 6, 3, 4, 7
    q = rng.normal(size=(b, lq, h, dk)).astype(np.float32)
    k = rng.normal(size=(b, lk, h, dk)).astype(np.float32)
    v = rng.normal(size=(b, lk, h, dv)).astype(np.float32)
    q_valid = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)
    k_valid = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], bool)
    mask = np.asarray(attention.padding_mask(jnp.asarray(q_valid), jnp.asarray(k_valid)))
    mask = mask & np.tril(np.ones((lq, lk), bool))[None, None]  # combined padding + causal
    out, weights = attention.dot_product_attention(q, k, v, jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(out), numpy_attention(q, k, v, mask), atol=1e-5)
    # weights are normalized over the key axis for every row that has a key
    sums = np.asarray(weights).sum(-1)
    has_key = np.broadcast_to(mask, weights.shape).any(-1)
    np.testing.assert_allclose(sums[has_key], 1.0, rtol=1e-5)
    assert np.all(sums[~has_key] == 0)


def test_all_masked_row_is_finite_zero():
    q = jnp.ones((1, 2, 1, 4))
    mask = jnp.zeros((1, 1, 2, 3), bool)
    out, w = attention.dot_product_attention(q, q[:, :1].repeat(3, 1), q[:, :1].repeat(3, 1), mask)
    assert np.all(np.isfinite(np.asarray(out))) and np.all(np.asarray(out) == 0)
    # and gradients through an all-masked row are finite too
    g = jax.grad(lambda x: attention.dot_product_attention(x, x, x, mask[:, :, :, :2])[0].sum())(q)
    assert np.all(np.isfinite(np.asarray(g)))


def test_causal_mask_is_lower_triangle():
    m = np.asarray(attention.causal_mask(4))[0, 0]
    np.testing.assert_array_equal(m, np.tril(np.ones((4, 4), bool)))


def test_sinusoids_match_formula():
    table = sinusoidal_table(50, 16)
    pos, i = 7, 3
    np.testing.assert_allclose(table[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / 16)), rtol=1e-6)
    np.testing.assert_allclose(
        table[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / 16)), rtol=1e-6
    )


def test_shift_right_inserts_bos_and_keeps_pad():
    t = jnp.array([[5, 6, EOS_ID, PAD_ID]])
    np.testing.assert_array_equal(np.asarray(shift_right(t)), [[BOS_ID, 5, 6, PAD_ID]])
    # packed row: each example (position 0) starts with BOS
    t = jnp.array([[5, EOS_ID, 7, 8, EOS_ID, PAD_ID]])
    pos = jnp.array([[0, 1, 0, 1, 2, 0]])
    np.testing.assert_array_equal(np.asarray(shift_right(t, pos)), [[BOS_ID, 5, BOS_ID, 7, 8, 0]])


def small_model(**kw):
    args = dict(
        vocab_size=40, num_layers=2, d_model=32, d_ff=48, num_heads=4, d_k=8, d_v=6, max_len=32
    )
    args.update(kw)
    return Transformer(**args)


SRC = np.array([[5, 6, 7, 8, EOS_ID, 0, 0], [9, 10, EOS_ID, 0, 0, 0, 0]], np.int32)
TGT = np.array([[11, 12, 13, EOS_ID, 0, 0], [14, 15, 16, 17, 18, EOS_ID]], np.int32)


@pytest.fixture(scope="module", params=["post", "pre"])
def model_and_params(request):
    model = small_model(norm=request.param)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), SRC, TGT))["params"]
    return model, params


def test_causality(model_and_params):
    model, params = model_and_params
    base = np.asarray(model.apply({"params": params}, SRC, TGT))
    for t in range(TGT.shape[1] - 1):
        changed = TGT.copy()
        changed[1, t + 1] = 30  # change target token t+1 -> decoder input t+2 changes
        out = np.asarray(model.apply({"params": params}, SRC, changed))
        # logits at positions <= t+1 only see decoder inputs <= t+1 (= targets <= t)
        np.testing.assert_allclose(out[1, : t + 2], base[1, : t + 2], atol=1e-5)
        assert not np.allclose(out[1, t + 2 :], base[1, t + 2 :], atol=1e-5) or t + 2 >= 6


def test_padding_invariance(model_and_params):
    model, params = model_and_params
    base = np.asarray(model.apply({"params": params}, SRC, TGT))
    more_pad = np.pad(SRC, ((0, 0), (0, 5)))
    out = np.asarray(model.apply({"params": params}, more_pad, TGT))
    real = TGT != PAD_ID
    np.testing.assert_allclose(out[real], base[real], atol=1e-5)
    longer_tgt = np.pad(TGT, ((0, 0), (0, 3)))
    out = np.asarray(model.apply({"params": params}, SRC, longer_tgt))[:, : TGT.shape[1]]
    np.testing.assert_allclose(out[real], base[real], atol=1e-5)


def test_all_pad_row_gives_no_nan(model_and_params):
    model, params = model_and_params
    src = SRC.copy()
    src[1] = PAD_ID
    tgt = TGT.copy()
    tgt[1] = PAD_ID
    out = model.apply({"params": params}, src, tgt)
    assert np.all(np.isfinite(np.asarray(out)))


def test_packed_rows_equal_separate_rows(model_and_params):
    model, params = model_and_params
    base = np.asarray(model.apply({"params": params}, SRC, TGT))
    s0, s1 = SRC[0][SRC[0] != 0], SRC[1][SRC[1] != 0]
    t0, t1 = TGT[0][TGT[0] != 0], TGT[1][TGT[1] != 0]
    src = np.concatenate([s0, s1, [0]])[None]
    tgt = np.concatenate([t0, t1, [0]])[None]
    seg_s = np.concatenate([np.ones(len(s0)), 2 * np.ones(len(s1)), [0]])[None].astype(np.int32)
    seg_t = np.concatenate([np.ones(len(t0)), 2 * np.ones(len(t1)), [0]])[None].astype(np.int32)
    pos_s = np.concatenate([np.arange(len(s0)), np.arange(len(s1)), [0]])[None].astype(np.int32)
    pos_t = np.concatenate([np.arange(len(t0)), np.arange(len(t1)), [0]])[None].astype(np.int32)
    out = np.asarray(model.apply({"params": params}, src, tgt, seg_s, seg_t, pos_s, pos_t))[0]
    np.testing.assert_allclose(out[: len(t0)], base[0, : len(t0)], atol=1e-5)
    np.testing.assert_allclose(out[len(t0) : len(t0) + len(t1)], base[1, : len(t1)], atol=1e-5)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_incremental_decoding_equals_full_forward(positional):
    model = small_model(positional=positional)
    params = nn.unbox(model.init(jax.random.PRNGKey(1), SRC, TGT))["params"]
    full = np.asarray(model.apply({"params": params}, SRC, TGT))
    encoded = model.apply({"params": params}, SRC, method=Transformer.encode)
    cache = translate.init_cache(model, params, encoded, SRC, max_decode_len=10)
    dec_in = shift_right(jnp.asarray(TGT))
    step = jax.jit(
        lambda c, tok: model.apply(
            {"params": params, "cache": c},
            encoded,
            SRC,
            tok,
            decode=True,
            mutable=["cache"],
            method=Transformer.decode,
        )
    )
    for t in range(TGT.shape[1]):
        logits, mut = step(cache, dec_in[:, t : t + 1])
        cache = mut["cache"]
        real = TGT[:, t] != PAD_ID
        np.testing.assert_allclose(np.asarray(logits)[real, 0], full[real, t], atol=1e-5)


def test_learned_positions_start_at_the_configured_scale():
    """model.learned_pos_init_std (Table 3 row E's probe E-std1): the learned table's initial
    std; 0.02 by default, 1.0 puts it at the scaled token embeddings' std."""
    for std in (0.02, 1.0):
        model = small_model(positional="learned", learned_pos_init_std=std)
        params = nn.unbox(model.init(jax.random.PRNGKey(0), SRC, TGT))["params"]
        table = np.asarray(params["src_pos"]["pos_embedding"])
        assert table.std() == pytest.approx(std, rel=0.1)
        emb = np.asarray(params["embed"]["embedding"]) * model.d_model**0.5
        assert emb.std() == pytest.approx(1.0, rel=0.1)  # tokens x sqrt(d_model): unit scale


def test_dk_dv_independent_of_heads():
    model = small_model(num_heads=2, d_k=3, d_v=5)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), SRC, TGT)["params"]
    attn = nn.unbox(shapes)["encoder_0"]["attention_block"]
    # the attention module is nested under the block via the lambda; find its params
    leaves = {
        "/".join(str(getattr(k, "key", k)) for k in path): v.shape
        for path, v in jax.tree_util.tree_flatten_with_path(nn.unbox(shapes))[0]
    }
    assert leaves["encoder_0/self_attention/query"] == (32, 2, 3)
    assert leaves["encoder_0/self_attention/value"] == (32, 2, 5)
    assert leaves["encoder_0/self_attention/out"] == (2, 5, 32)
    del attn


def test_bfloat16_compute_tracks_float32_and_decodes_incrementally():
    """model.dtype=bfloat16: f32 params, bf16 products with f32 sums (matmul.py), f32 logits."""
    f32 = small_model()
    bf16 = small_model(dtype="bfloat16")
    params = nn.unbox(f32.init(jax.random.PRNGKey(2), SRC, TGT))["params"]
    full32 = np.asarray(f32.apply({"params": params}, SRC, TGT))
    full = bf16.apply({"params": params}, SRC, TGT)
    assert full.dtype == jnp.float32
    full = np.asarray(full)
    real = TGT != PAD_ID
    assert np.abs(full - full32)[real].max() < 0.05 * np.abs(full32[real]).max()
    # Batch 1 then 2: one-row decoding steps make matrix-vector products (the small-dot path).
    for rows in (slice(1, 2), slice(0, 2)):
        src, tgt = SRC[rows], TGT[rows]
        encoded = bf16.apply({"params": params}, src, method=Transformer.encode)
        cache = translate.init_cache(bf16, params, encoded, src, max_decode_len=10)
        dec_in = shift_right(jnp.asarray(tgt))
        for t in range(tgt.shape[1]):
            logits, mut = bf16.apply(
                {"params": params, "cache": cache}, encoded, src, dec_in[:, t : t + 1],
                decode=True, mutable=["cache"], method=Transformer.decode,
            )  # fmt: skip
            cache = mut["cache"]
            ok = tgt[:, t] != PAD_ID
            np.testing.assert_allclose(
                np.asarray(logits)[ok, 0], full[rows][ok, t], atol=0.05 * np.abs(full).max()
            )


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_scan_layers_equals_unrolled_in_loss_and_gradients(norm):
    """model.scan_layers=True is the same function of the same (stacked) params."""
    scanned = small_model(num_layers=3, norm=norm, scan_layers=True)
    unrolled = small_model(num_layers=3, norm=norm)
    p_scan = nn.unbox(scanned.init(jax.random.PRNGKey(0), SRC, TGT))["params"]
    assert p_scan["encoder"]["layer"]["ffn"]["wi"]["kernel"].shape == (3, 32, 48)
    p_unrolled = unstack_layers(p_scan, 3)
    unrolled_names = nn.unbox(unrolled.init(jax.random.PRNGKey(0), SRC, TGT))["params"]
    assert set(p_unrolled) == set(unrolled_names)
    jax.tree.map(np.testing.assert_array_equal, stack_layers(p_unrolled, 3), p_scan)

    def loss(model, params):
        logits = model.apply({"params": params}, SRC, TGT)
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, TGT[..., None], -1)[..., 0]
        return jnp.sum(nll * (TGT != PAD_ID))

    l_scan, g_scan = jax.value_and_grad(lambda p: loss(scanned, p))(p_scan)
    l_unrolled, g_unrolled = jax.value_and_grad(lambda p: loss(unrolled, p))(p_unrolled)
    np.testing.assert_allclose(l_scan, l_unrolled, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_scan), jax.tree.leaves(stack_layers(g_unrolled, 3)),
                    strict=True):  # fmt: skip
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Dropout: each layer draws its own masks (split rngs), and training-mode outputs differ.
    rngs = {"dropout": jax.random.PRNGKey(1)}
    train_out = scanned.apply({"params": p_scan}, SRC, TGT, deterministic=False, rngs=rngs)
    assert np.all(np.isfinite(train_out))
    assert not np.allclose(train_out, scanned.apply({"params": p_scan}, SRC, TGT))
    with pytest.raises(ValueError, match="scan_layers"):
        enc = scanned.apply({"params": p_scan}, SRC, method=Transformer.encode)
        translate.init_cache(scanned, p_scan, enc, SRC, 8)


def test_scan_layers_run_trains_and_decodes_unrolled(tmp_path):
    """A scan_layers run: the loop's eval perplexity (scanned) equals inference's (unrolled)."""
    from helpers.runs import tiny_run_config, write_tiny_corpus

    from tfm_jax.train import loop

    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=300, n_val=32)
    overrides = {"model.scan_layers": True, "model.num_layers": 2, "train.num_steps": 4,
                 "train.eval_every_steps": 4}  # fmt: skip
    cfg = tiny_run_config(corpus, **overrides)
    metrics = loop.train_and_evaluate(cfg, str(tmp_path / "run"))
    cfg = loop.pin_vocabulary(cfg, load.load_tokenizer(cfg, str(tmp_path / "run")))
    model, params, tokenizer = load.load_for_inference(str(tmp_path / "run"), "latest", cfg)
    assert not model.scan_layers and "encoder_1" in params
    ppl = evaluate.perplexity(cfg, model, params, tokenizer, cfg.data.eval_split)
    np.testing.assert_allclose(ppl["ppl"], metrics["eval_ppl"], rtol=1e-5)
    hyps = translate.translate_texts(cfg, model, params, tokenizer, ["a dog", "two men run"])
    assert len(hyps) == 2 and all(isinstance(h, str) for h in hyps)
