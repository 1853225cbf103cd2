"""libai.utils.plot.plot_loss_curve: which metrics.json keys become which series, and how
the figure is drawn (read back from the matplotlib figure it saves and from the PNG)."""

from __future__ import annotations

import json
import struct

import pytest
from matplotlib.figure import Figure

from libai.utils.plot import _is_eval_loss, _is_ppl, _series, plot_loss_curve


@pytest.fixture
def figures(monkeypatch):
    """Every figure plot_loss_curve saves."""
    saved = []
    real_savefig = Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append(self)
        return real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def write_metrics(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def png_size(path) -> tuple[int, int]:
    data = open(path, "rb").read(24)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def lines_of(ax):
    return {
        line.get_label(): (
            [int(x) for x in line.get_xdata()],
            [float(y) for y in line.get_ydata()],
            line.get_color(),
            line.get_marker(),
            line.get_linestyle(),
            line.get_linewidth(),
            line.get_markersize(),
        )
        for line in ax.get_lines()
    }


@pytest.mark.parametrize(
    "key, expected",
    [
        ("loss", True),
        ("eval/loss", True),
        ("EVAL/LOSS", True),
        ("val_loss", True),
        ("Valid_Loss", True),
        ("validation/lm_loss", True),
        ("test_loss", True),
        ("eval_mlm_loss", True),
        ("dev/loss", True),  # "loss" after the last "/", whatever the prefix
        ("dev/lm/loss", True),
        ("total_loss", False),
        ("lm_loss", False),
        ("train/lm_loss", False),
        ("val_loss_scale", False),
        ("val_acc", False),
    ],
)
def test_eval_loss_keys(key, expected):
    assert _is_eval_loss(key) is expected


@pytest.mark.parametrize(
    "key, expected",
    [
        ("ppl", True),
        ("PPL", True),
        ("val/ppl", True),
        ("eval_PPL", True),
        ("ppl/x", False),
        ("ppl_std", False),
        ("val_ppl ", False),
    ],
)
def test_ppl_keys(key, expected):
    assert _is_ppl(key) is expected


def test_series_keeps_finite_numbers_only():
    records = [
        {"iteration": 0, "x": 1.5},
        {"iteration": 1, "x": float("nan")},
        {"iteration": 2, "x": "2.0"},
        {"iteration": 3},
        {"iteration": 4, "x": 7},
        {"iteration": 5, "x": float("inf")},
        {"iteration": 6, "x": None},
    ]
    assert _series(records, "x") == ([0, 4], [1.5, 7])


def test_train_and_validation_panels(tmp_path, figures):
    records = []
    for i in range(6):
        record = {"iteration": i, "total_loss": 6.0 - i, "lr": 0.1, "lm_loss": 1.0}
        if i % 2:
            record.update({"val_loss": 5.0 - i, "ppl": 3.0**i})  # ppl 3 .. 243: log scale
        records.append(record)
    records.append({"iteration": 2, "total_loss": 9.0})  # a resumed run re-did iteration 2
    path = write_metrics(tmp_path / "my_run" / "metrics.json", records)
    out = plot_loss_curve(path, str(tmp_path / "plots" / "deep" / "curve.png"))
    assert out == str(tmp_path / "plots" / "deep" / "curve.png")
    assert png_size(out) == (1280, 440)  # two panels of 6.4 x 4.4 inches at 100 dpi
    (fig,) = figures
    assert fig._suptitle.get_text() == "my_run"
    loss, ppl = fig.axes
    assert (loss.get_title(), loss.get_xlabel(), loss.get_ylabel()) == ("loss", "iteration", "loss")
    assert lines_of(loss) == {
        "train total_loss": (
            [0, 1, 2, 3, 4, 5],
            [6.0, 5.0, 9.0, 3.0, 2.0, 1.0],
            "tab:blue",
            "None",
            "-",
            1.2,
            6.0,
        ),
        "validation val_loss": ([1, 3, 5], [4.0, 2.0, 0.0], "tab:orange", "o", "-", 1.5, 4.0),
    }
    assert loss.get_legend()._loc == 1  # "upper right"
    assert [t.get_text() for t in loss.get_legend().get_texts()] == [
        "train total_loss",
        "validation val_loss",
    ]
    gridline = loss.yaxis.get_major_ticks()[0].gridline
    assert gridline.get_visible() and gridline.get_alpha() == 0.3
    assert loss.get_yscale() == "linear"
    assert (ppl.get_title(), ppl.get_xlabel(), ppl.get_ylabel()) == (
        "validation perplexity",
        "iteration",
        "perplexity",
    )
    assert lines_of(ppl) == {
        "validation ppl": ([1, 3, 5], [3.0, 27.0, 243.0], "tab:green", "o", "-", 1.5, 4.0)
    }
    assert ppl.get_yscale() == "log"  # 243 / 3 > 10
    assert [t.get_text() for t in ppl.get_legend().get_texts()] == ["validation ppl"]
    assert ppl.get_legend()._loc == 0  # "best"
    for ticks in (ppl.yaxis.get_major_ticks(), ppl.yaxis.get_minor_ticks()):
        assert ticks and ticks[0].gridline.get_visible() and ticks[0].gridline.get_alpha() == 0.3


@pytest.mark.parametrize(
    "values, scale",
    [
        ([2.0, 20.0], "linear"),
        ([2.0, 20.5], "log"),
        ([1.0, 10.0], "linear"),
        ([1.0, 10.5], "log"),  # a perplexity of exactly 1 (loss 0) still allows log
        ([0.0, 50.0], "linear"),
    ],
)
@pytest.mark.filterwarnings("ignore:No artists with labels")
def test_perplexity_is_log_scaled_only_beyond_ten_times(tmp_path, figures, values, scale):
    records = [{"iteration": i, "eval/ppl": v} for i, v in enumerate(values)]
    path = write_metrics(tmp_path / "m.json", records)
    plot_loss_curve(path, str(tmp_path / "p.png"), title="mine")
    (fig,) = figures
    loss, ppl = fig.axes
    assert fig._suptitle.get_text() == "mine"
    assert loss.get_lines() == [] and ppl.get_yscale() == scale


def test_training_loss_only_is_one_panel(tmp_path, figures):
    records = [{"iteration": i, "total_loss": 1.0 / (i + 1), "ppl": "n/a"} for i in range(3)]
    path = write_metrics(tmp_path / "m.json", records)
    out = plot_loss_curve(path, str(tmp_path / "p.png"))
    assert png_size(out) == (640, 440)
    (fig,) = figures
    (ax,) = fig.axes
    assert list(lines_of(ax)) == ["train total_loss"]


def test_validation_only_still_plots(tmp_path, figures):
    path = write_metrics(tmp_path / "m.json", [{"iteration": 9, "loss": 2.5}])
    plot_loss_curve(path, str(tmp_path / "p.png"))
    (fig,) = figures
    assert list(lines_of(fig.axes[0])) == ["validation loss"]


def test_nothing_to_plot_names_the_keys(tmp_path):
    path = write_metrics(
        tmp_path / "m.json",
        [{"iteration": 0, "lr": 0.1, "total_loss": float("nan"), "val_loss": None}],
    )
    with pytest.raises(ValueError, match=r"holds no 'total_loss' or validation metric"):
        plot_loss_curve(path, str(tmp_path / "p.png"))
    assert not (tmp_path / "p.png").exists()


def test_panels_side_by_side_at_a_fixed_size_without_warnings(tmp_path, figures):
    import warnings

    import matplotlib

    records = [
        {"iteration": i, "total_loss": 5.0 - i, "val_loss": 4.0 - i, "ppl": 3.0**i}
        for i in range(4)
    ]
    path = write_metrics(tmp_path / "m.json", records)
    # the user's own figure settings do not change the picture
    with matplotlib.rc_context({"figure.dpi": 37, "savefig.dpi": "figure"}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = plot_loss_curve(path, str(tmp_path / "p.png"))
    assert png_size(out) == (1280, 440)
    (fig,) = figures
    assert fig.get_dpi() == 100
    loss, ppl = fig.axes
    assert loss.get_subplotspec().get_geometry() == (1, 2, 0, 0)  # one row, two columns
    assert ppl.get_subplotspec().get_geometry() == (1, 2, 1, 1)
