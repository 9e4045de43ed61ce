"""The model's FLOPs counted from its shapes: the one analytic count (benchmarks, the training
log where XLA gives none, the `compile` command's MFU)."""

from __future__ import annotations


def matmul_flops(model_cfg, batch: int, src_len: int, tgt_len: int) -> float:
    """Analytic matmul FLOPs of one train step (3x forward: forward + two backward products).

    A cross-check on XLA's cost analysis, which also counts elementwise work (softmax, LayerNorm,
    Adam); the two should agree to within a few percent for the base model. Padded slots count:
    this is the work the step does, not the work its real tokens need.
    """
    m = model_cfg
    d, h, dk, dv, ff, n = m.d_model, m.num_heads, m.d_k, m.d_v, m.d_ff, m.num_layers
    S, T = batch * src_len, batch * tgt_len  # noqa: N806
    proj = lambda tok: 2 * tok * d * h * (2 * dk + dv) + 2 * tok * h * dv * d  # noqa: E731
    enc = proj(S) + 2 * batch * h * src_len * src_len * (dk + dv) + 4 * S * d * ff
    dec_self = proj(T) + 2 * batch * h * tgt_len * tgt_len * (dk + dv)
    dec_cross = (
        2 * T * d * h * dk + 2 * S * d * h * (dk + dv) + 2 * T * h * dv * d
        + 2 * batch * h * tgt_len * src_len * (dk + dv)
    )  # fmt: skip
    dec = dec_self + dec_cross + 4 * T * d * ff
    logits = 2 * T * d * m.vocab_size
    return 3.0 * (n * (enc + dec) + logits)


def forward_flops(model_cfg, batch: int, src_len: int, tgt_len: int) -> float:
    """The same count for a forward pass alone (the eval step)."""
    return matmul_flops(model_cfg, batch, src_len, tgt_len) / 3.0
