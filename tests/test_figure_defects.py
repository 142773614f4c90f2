"""Figure defects a reader sees: dots drawn hollow, verdicts that call a tie a win, captions cut
off at the canvas's edge or too small to read, tick labels that say nothing, lines told apart
by colour alone, and notebook prose that contradicts the numbers printed above it."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgba_array  # noqa: E402

from flnotes.repro import figures  # noqa: E402
from flnotes.toy import landscapes  # noqa: E402
from flnotes.toy import plots as toy_plots  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "flnotes" / "notebooks"
SMOKE = REPO / "results" / "paper-figures-smoke"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _tick_labels(axis) -> list[str]:
    """The major tick labels shown inside the axis's view after a draw."""
    lo, hi = sorted(axis.get_view_interval())
    return [t.get_text() for t in axis.get_ticklabels()
            if t.get_text() and lo <= t.get_position()[axis.axis_name == "y"] <= hi]


# ---- notebook 04: endpoint dots --------------------------------------------------------------


def test_endpoint_dots_are_drawn_white_in_the_flat_basin_and_red_elsewhere():
    fed = landscapes.make_federation("fedmut-fig1", num_clients=4)
    rows = [{"algorithm": "fedavg", "x": 0.1, "y": 0.2, "accuracy": 1.0},
            {"algorithm": "fedavg", "x": -1.0, "y": -1.5, "accuracy": 0.0},
            {"algorithm": "fedmut", "x": -1.2, "y": -1.4, "accuracy": 0.0}]
    figure = toy_plots.EndpointsFigure(fed.global_loss, 2, federation=fed)
    figure.set(rows)
    figure.fig.canvas.draw()  # matplotlib maps colours at draw time: read them after one
    fedavg, fedmut = figure.dots
    assert np.allclose(fedavg.get_facecolors(), to_rgba_array(["white", "red"]))
    assert np.allclose(fedmut.get_facecolors(), to_rgba_array(["red"]))
    # a second set (an explorer's move) keeps them filled
    figure.set([{**r, "accuracy": 1.0 - r["accuracy"]} for r in rows])
    figure.fig.canvas.draw()
    assert np.allclose(fedavg.get_facecolors(), to_rgba_array(["red", "white"]))


# ---- notebook 22: a tie is a tie ---------------------------------------------------------------


def _line(label: str, last: float) -> figures.Line:
    rounds = np.array([1.0, 2.0])
    values = np.array([last - 1.0, last])
    return figures.Line(label, rounds, values, values, values, 1)


@pytest.mark.parametrize("name", ["fedup-fig3", "fedmr-fig10"])
def test_a_tie_with_the_claimed_line_reads_as_a_tie(name):
    figure = figures.FIGURES[name]
    claimed = figure.expected_best[0]
    (verdict,) = figures.summary(figure, [("panel", [_line("FedAvg", 18.02),
                                                     _line(claimed, 18.02)])])
    assert "holds" not in verdict and "does not hold" not in verdict
    assert f"FedAvg and {claimed} tie" in verdict


def test_a_tie_below_the_best_and_a_clear_win_keep_their_verdicts():
    figure = figures.FIGURES["fedup-fig3"]
    (won,) = figures.summary(figure, [("p", [_line("FedAvg", 18.0), _line("FedUp", 18.5)])])
    assert "the paper's ordering holds (FedUp ends best)" in won
    (lost,) = figures.summary(figure, [("p", [_line("FedAvg", 19.0), _line("FedUp", 18.5),
                                              _line("MOON", 18.5)])])
    assert "does not hold (FedAvg ends best)" in lost
    # a tie at the printed precision is a tie: the reader sees the same two numbers
    (close,) = figures.summary(figure, [("p", [_line("FedAvg", 18.021),
                                               _line("FedUp", 18.019)])])
    assert "tie" in close and "holds" not in close
    # two lines the paper both names as best, tied with each other: the claim holds
    fig12 = figures.FIGURES["fedmr-fig12"]
    (both,) = figures.summary(fig12, [("p", [_line("FedMR-0", 10.0), _line("FedMR-50", 12.0),
                                             _line("FedMR-100", 12.0)])])
    assert "the paper's ordering holds" in both
