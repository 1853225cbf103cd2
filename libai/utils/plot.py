"""Plot a run's loss curve from ``output_dir/metrics.json`` (written by ``JSONWriter``).

Uses matplotlib's Agg canvas directly (no pyplot, no global backend switch), so it works on
headless machines and does not disturb an interactive session.
"""

from __future__ import annotations

import math
import os

from libai.utils.events import iter_metrics

__all__ = ["plot_loss_curve"]

_EVAL_PREFIXES = ("val", "valid", "validation", "eval", "test")


def _is_eval_loss(key: str) -> bool:
    """Evaluation loss keys: ``loss`` (PPLEvaluator), ``val_loss``, ``eval/loss``, ..."""
    last = key.rsplit("/", 1)[-1].lower()
    if last == "loss":
        return True
    return last.endswith("loss") and key.lower().startswith(_EVAL_PREFIXES)


def _is_ppl(key: str) -> bool:
    return key.rsplit("/", 1)[-1].lower().endswith("ppl")


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            xs.append(record["iteration"])
            ys.append(value)
    return xs, ys


def plot_loss_curve(metrics_json: str, out_png: str, title: str | None = None) -> str:
    """Plot ``total_loss`` (and validation loss / perplexity if present) against iteration.

    Validation series are the keys of evaluation results: ``loss`` / ``*_loss`` under an
    eval prefix (``val``, ``eval``, ...) drawn with the training loss, and any ``*ppl`` key
    on a second panel (log scale when it spans more than 10x). Where a resumed run repeated
    iterations, the later records win. Returns ``out_png``; raises ``ValueError`` when the
    file holds no ``total_loss`` and no validation metric.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = list(iter_metrics(metrics_json))
    keys = sorted({k for record in records for k in record})
    train = _series(records, "total_loss")
    eval_losses = {k: _series(records, k) for k in keys if _is_eval_loss(k)}
    ppls = {k: _series(records, k) for k in keys if _is_ppl(k)}
    eval_losses = {k: v for k, v in eval_losses.items() if v[0]}
    ppls = {k: v for k, v in ppls.items() if v[0]}
    if not train[0] and not eval_losses and not ppls:
        raise ValueError(
            f"{metrics_json} holds no 'total_loss' or validation metric to plot "
            f"(keys: {keys[:20]})."
        )

    ncols = 2 if ppls else 1
    fig = Figure(figsize=(6.4 * ncols, 4.4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, ncols, 1)
    if train[0]:
        ax.plot(*train, label="train total_loss", color="tab:blue", linewidth=1.2)
    for key, (xs, ys) in eval_losses.items():
        ax.plot(xs, ys, "o-", label=f"validation {key}", color="tab:orange", markersize=4)
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.set_title("loss")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right")
    if ppls:
        ax2 = fig.add_subplot(1, ncols, 2)
        for key, (xs, ys) in ppls.items():
            ax2.plot(xs, ys, "o-", label=f"validation {key}", color="tab:green", markersize=4)
        values = [y for _, ys in ppls.values() for y in ys]
        if min(values) > 0 and max(values) / min(values) > 10:  # log only for a wide range
            ax2.set_yscale("log")
        ax2.set_xlabel("iteration")
        ax2.set_ylabel("perplexity")
        ax2.set_title("validation perplexity")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend()
    fig.suptitle(title or os.path.basename(os.path.dirname(os.path.abspath(metrics_json))))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png)
    return out_png
