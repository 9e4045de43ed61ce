"""Learning curves from a run's metrics.jsonl, drawn with matplotlib (no display needed)."""

from __future__ import annotations

import io
import json
import logging

from tfm_jax.platform import storage

log = logging.getLogger(__name__)


def save_figure(fig, out: str) -> None:
    """A matplotlib figure as a PNG at a local path or a gs:// URL (rendered in memory)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    storage.write_bytes(out, buffer.getvalue())


def read_metrics(workdir: str) -> list[dict]:
    """The records of a run's metrics.jsonl (train/reporting.py's MetricsWriter writes them,
    one JSON object a line); `workdir` may also be the metrics.jsonl itself, local or gs://."""
    path = workdir if not storage.isdir(workdir) else storage.join(workdir, "metrics.jsonl")
    if not storage.exists(path):
        raise FileNotFoundError(f"{path} does not exist: train first (python -m tfm_jax train)")
    records, cut = [], 0
    for line in filter(str.strip, storage.read_text(path).splitlines()):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            cut += 1
    if cut:  # a kill or a full disk mid-append; the run resumed after it appends on
        log.warning("%s: skipped %d line(s) that are not whole JSON (a write cut short)", path, cut)
    return records


def plot_learning_curves(workdir: str, out: str | None = None) -> str:
    """Train loss/NLL, validation perplexity and throughput against steps -> PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(workdir)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label="smoothed loss")
    axes[0].plot([r["step"] for r in train], [r["nll"] for r in train], label="NLL")
    axes[0].set(xlabel="step", ylabel="per token", title="training loss")
    axes[0].legend()
    axes[1].plot([r["step"] for r in evals], [r["ppl"] for r in evals], "o-")
    axes[1].set(xlabel="step", ylabel="perplexity", title="validation perplexity", yscale="log")
    axes[2].plot([r["step"] for r in train], [r["target_tokens_per_s"] for r in train])
    axes[2].set(xlabel="step", ylabel="target tokens/s", title="throughput")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = out or storage.join(workdir, "learning_curves.png")
    save_figure(fig, out)
    plt.close(fig)
    return out
