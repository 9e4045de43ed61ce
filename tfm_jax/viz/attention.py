"""Attention heatmaps (as in the paper's appendix figures) for one sentence and its translation.

The weights are captured without changing the model: a `flax.linen.intercept_methods`
interceptor re-runs every MultiHeadAttention call as a clone with `sow_weights=True` on the same
params, which sows its [b, h, q, k] softmax weights, and returns the clone's (identical) output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from matplotlib.figure import Figure  # no pyplot: the Agg canvas, no global backend state

from tfm_jax.data.tokenizer import Tokenizer
from tfm_jax.decode import load, translate
from tfm_jax.model.attention import MultiHeadAttention
from tfm_jax.model.transformer import Transformer
from tfm_jax.platform import storage
from tfm_jax.viz.curves import save_figure
from tfm_jax.vocab_ids import BOS_ID, EOS_ID

KINDS = {  # file prefix -> (module name inside each layer, stack prefix, title)
    "enc_self": ("self_attention", "encoder", "encoder self-attention"),
    "dec_self": ("self_attention", "decoder", "decoder self-attention"),
    "enc_dec": ("cross_attention", "decoder", "encoder-decoder attention"),
}


def _attention_forward(params, inputs, targets, *, model: Transformer):
    captured = {}

    def interceptor(next_fun, args, kwargs, context):
        mod = context.module
        if (
            not isinstance(mod, MultiHeadAttention)
            or context.method_name != "__call__"
            or mod.sow_weights  # the clone below: let it run
        ):
            return next_fun(*args, **kwargs)
        clone = mod.clone(parent=None, sow_weights=True)
        out, state = clone.apply(
            {"params": mod.variables["params"]}, *args, **kwargs, mutable=["intermediates"]
        )
        captured["/".join(mod.path)] = state["intermediates"]["attention_weights"][0]
        return out

    with nn.intercept_methods(interceptor):
        logits = model.apply({"params": params}, inputs, targets)
    return logits, captured  # the captured tracers leave the trace as outputs


_attention_forward_jit = jax.jit(_attention_forward, static_argnames="model")


def capture_attention(
    model: Transformer, params, inputs, targets
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Teacher-forced forward: (logits, {"encoder_0/self_attention": [b, h, q, k], ...})."""
    logits, captured = jax.device_get(_attention_forward_jit(params, inputs, targets, model=model))
    return np.asarray(logits), {k: np.asarray(v) for k, v in captured.items()}


def parse_indices(text: str, count: int, flag: str) -> list[int]:
    """Parses "all" or comma-separated (possibly negative) indices into range(count)."""
    if text.strip() == "all":
        return list(range(count))
    try:
        raw = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise load.InferenceError(f'{flag}={text!r}: expected "all" or indices like 0,-1') from None
    bad = [i for i in raw if not -count <= i < count]
    if bad or not raw:
        raise load.InferenceError(f"{flag}={text!r}: indices must be in [{-count}, {count})")
    return sorted({i % count for i in raw})


def pieces(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """Sentencepiece pieces of `ids` for axis labels, with <s> and </s> for BOS and EOS."""
    sp = tokenizer._sp  # the Tokenizer exposes no id_to_piece of its own
    names = {BOS_ID: "<s>", EOS_ID: "</s>"}
    return [names.get(int(i), sp.id_to_piece(int(i))) for i in ids]


def plot_heads(
    weights: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    heads: Sequence[int],
    title: str,
    path: str,
    *,
    row_title: str,
    col_title: str,
) -> None:
    """One heatmap per head of weights [h, q, k] on a grid, saved as a PNG."""
    ncols = min(4, len(heads))
    nrows = math.ceil(len(heads) / ncols)
    cell = max(2.5, 0.22 * max(len(row_labels), len(col_labels)) + 1.0)
    vmax = float(np.max(weights[list(heads)])) or 1.0  # one colour scale for all heads shown
    fig = Figure(figsize=(cell * ncols, cell * nrows + 0.6), layout="constrained")
    for n, h in enumerate(heads):
        ax = fig.add_subplot(nrows, ncols, n + 1)
        ax.imshow(weights[h], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xlabel(col_title, fontsize=8)
        ax.set_ylabel(row_title, fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path)


def plot_sentence(
    cfg: ml_collections.ConfigDict,
    model: Transformer,
    params,
    tokenizer: Tokenizer,
    text: str,
    *,
    out_dir: str,
    layers: Sequence[int],
    heads: Sequence[int],
) -> list[str]:
    """Greedy-translates `text`, then plots each attention kind for `layers` and `heads`.

    Decoder-side axes: the decoder's inputs (<s> y1 .. y_{n-1}) for self-attention; for
    encoder-decoder attention the rows are the tokens each position predicts (y1 .. </s>).
    Returns the PNG paths.
    """
    src = tokenizer.encode(text.strip())
    if not src:
        raise load.InferenceError("--text is empty")
    limit = translate.source_limit(cfg)
    src = src[: limit - 1] + [EOS_ID]
    (tgt,) = translate.translate_ids(cfg, model, params, [src[:-1]], greedy=True)
    _, weights = capture_attention(model, params, np.asarray([src]), np.asarray([tgt]))
    src_labels = pieces(tokenizer, src)
    out_labels = pieces(tokenizer, tgt)
    in_labels = ["<s>"] + out_labels[:-1]
    axes = {
        "enc_self": (src_labels, src_labels, "source (query)", "source (key)"),
        "dec_self": (in_labels, in_labels, "decoder input (query)", "decoder input (key)"),
        "enc_dec": (out_labels, src_labels, "predicted token (query)", "source (key)"),
    }
    storage.makedirs(out_dir)
    files = []
    for kind, (module, stack, title) in KINDS.items():
        rows, cols, row_title, col_title = axes[kind]
        for layer in layers:
            w = weights[f"{stack}_{layer}/{module}"][0]  # [h, q, k]
            path = storage.join(out_dir, f"{kind}_layer{layer}.png")
            plot_heads(
                w, rows, cols, heads, f"{title}, layer {layer}: {text.strip()!r}"[:120], path,
                row_title=row_title, col_title=col_title,
            )  # fmt: skip
            files.append(path)
    return files
