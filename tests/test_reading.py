"""The reading rule on constructed curves: one verdict per case, a tie never holds."""

import numpy as np
import pytest

from flnotes.repro.reading import CANNOT_TELL, DOES_NOT_HOLD, HOLDS, late_window, pair_reading, read

ROUNDS = np.arange(5, 205, 5)  # 40 evaluations: the late window is the last 10


def curve(level: float, wiggle: float = 0.0, phase: int = 0):
    values = level + wiggle * np.where((np.arange(len(ROUNDS)) + phase) % 2, 1.0, -1.0)
    return ROUNDS, values


def test_the_late_window_is_the_last_quarter_of_the_common_evaluations():
    assert late_window(ROUNDS).tolist() == list(range(155, 205, 5))
    assert late_window(np.array([10])).tolist() == [10]
    # Only the rounds both runs evaluated count; a lead before the window does not.
    a = (ROUNDS, np.where(ROUNDS <= 150, 90.0, 50.0))
    b = (ROUNDS[::2], np.full(len(ROUNDS[::2]), 60.0))
    seed = pair_reading(0, a, b)
    assert (seed.evaluations, seed.first_round, seed.last_round) == (5, 155, 195)
    assert seed.difference == pytest.approx(-10.0) and seed.leads == 0


def test_every_seed_ahead_by_more_than_the_spread_holds():
    a = {0: curve(52.0, 1.0), 1: curve(51.5, 1.0, phase=1), 2: curve(52.5)}
    b = {0: curve(50.0), 1: curve(49.5), 2: curve(50.0)}
    reading = read(a, b)
    assert reading.verdict == HOLDS
    assert [s.difference for s in reading.seeds] == pytest.approx([2.0, 2.0, 2.5])
    assert reading.spread == pytest.approx(0.5)
    assert [s.leads for s in reading.seeds] == [10, 10, 10]
    assert "holds" in reading.sentence("FedMut", "FedAvg") and "last 10" in \
        reading.sentence("FedMut", "FedAvg")


def test_every_seed_behind_by_more_than_the_spread_does_not_hold():
    reading = read({0: curve(47.0), 1: curve(46.0)}, {0: curve(50.0), 1: curve(50.0)})
    assert reading.verdict == DOES_NOT_HOLD
    assert reading.mean == pytest.approx(-3.5)


def test_seeds_that_disagree_cannot_tell():
    # Both seeds ahead, but by 0.5 and 3.0: the spread (2.5) exceeds the smaller lead.
    reading = read({0: curve(50.5), 1: curve(53.0)}, {0: curve(50.0), 1: curve(50.0)})
    assert reading.verdict == CANNOT_TELL
    assert "differ by 2.50, not less than the smallest difference in size (0.50)" in \
        reading.sentence("A", "B")
    # One ahead, one behind.
    mixed = read({0: curve(52.0), 1: curve(48.0)}, {0: curve(50.0), 1: curve(50.0)})
    assert mixed.verdict == CANNOT_TELL and "sign" in mixed.sentence("A", "B")


def test_a_tie_never_holds_and_one_seed_cannot_tell():
    tie = read({0: curve(50.0), 1: curve(51.0)}, {0: curve(50.0), 1: curve(51.0)})
    assert tie.verdict == CANNOT_TELL and [s.leads for s in tie.seeds] == [0, 0]
    assert "a tie" in tie.sentence("A", "B")
    one_tie = read({0: curve(49.0), 1: curve(51.0)}, {0: curve(50.0), 1: curve(51.0)})
    assert one_tie.verdict == CANNOT_TELL and "a tie" in one_tie.sentence("A", "B")
    broken = read({0: curve(float("nan")), 1: curve(52.0)}, {0: curve(50.0), 1: curve(50.0)})
    assert broken.verdict == CANNOT_TELL and "not a number" in broken.sentence("A", "B")
    # Ahead at every evaluation, but one seed only: cannot tell.
    single = read({0: curve(60.0)}, {0: curve(50.0)})
    assert single.verdict == CANNOT_TELL and "one seed" in single.sentence("A", "B")


def test_a_swinging_curve_ahead_on_average_counts_its_leads():
    # A swings by +-3 around a 1-point lead: ahead at half of the late evaluations.
    reading = read({0: curve(51.0, 3.0), 1: curve(51.0, 3.0, phase=1)},
                   {0: curve(50.0), 1: curve(50.0)})
    assert [s.leads for s in reading.seeds] == [5, 5]
    assert reading.verdict == HOLDS  # equal late leads of 1.0, spread 0
    assert read({}, {0: curve(50.0)}).verdict == CANNOT_TELL
