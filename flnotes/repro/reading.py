"""The reading rule: is "method A beats method B" shown by learning curves? Never one
evaluation: evaluations of one run swing by several points from one to the next (CIFAR-10
LeNet at Dirichlet 0.1: a median 2-4 points, up to 17), more than many of the papers' gaps.

The rule, for the pairs of runs of A and B that share a seed (same data split, same draws):

1. The late window: the last quarter of the evaluations both runs of a pair have (at least
   one, ``LATE_SHARE``); its size k and its rounds are stated with every reading.
2. Per seed: the late difference d_s = mean of A over the window - mean of B over it, and
   how many of the window's evaluations A leads (strictly ahead).
3. The spread: max_s d_s - min_s d_s, how far the seeds disagree about the difference.
4. "holds" when at least two seeds were run and every d_s exceeds the spread (so every seed
   leads, and by more than the seeds disagree); "does not hold" when every d_s is below
   minus the spread; "cannot tell" otherwise, and always with a single seed (one pair
   cannot tell the method from its seed). Equal late means (d_s = 0) never hold.

Used by the results page (``results_page``), ``tables`` (its readings under the tables),
the notebooks' answers (``evidence.answer``) and the paper figures' summaries (``figures``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

LATE_SHARE = 0.25  # the late window: this share of the evaluations a pair has in common
HOLDS, DOES_NOT_HOLD, CANNOT_TELL = "holds", "does not hold", "cannot tell"

Curve = tuple[np.ndarray, np.ndarray]  # (rounds, accuracy), rounds ascending


@dataclass(frozen=True)
class SeedReading:
    """One seed's pair of runs over its late window."""

    seed: int
    difference: float  # late mean of A minus late mean of B
    leads: int  # evaluations of the window where A is strictly ahead
    evaluations: int  # k, the window's size
    first_round: int
    last_round: int


@dataclass(frozen=True)
class Reading:
    """The verdict on "A > B" and what it rests on."""

    verdict: str
    seeds: tuple[SeedReading, ...]
    spread: float  # max - min of the per-seed late differences (0 with one seed)

    @property
    def mean(self) -> float:
        return float(np.mean([s.difference for s in self.seeds])) if self.seeds else math.nan

    def window(self) -> str:
        """'the last 10 evaluations (rounds 155-200)', or each seed's where they differ."""
        spans = {(s.evaluations, s.first_round, s.last_round) for s in self.seeds}
        if len(spans) == 1:
            k, first, last = spans.pop()
            rounds = f"round {last}" if first == last else f"rounds {first}-{last}"
            return f"the last {k} evaluation{'s' if k > 1 else ''} ({rounds})"
        return "each seed's last quarter of evaluations"

    def sentence(self, a: str, b: str) -> str:
        """One sentence: the verdict, per seed the late difference and leads, the window."""
        if not self.seeds:
            return f"{a} > {b}: cannot tell, no seed has both runs yet."
        per_seed = "; ".join(f"seed {s.seed} {s.difference:+.2f}, ahead at {s.leads} of "
                             f"{s.evaluations}" for s in self.seeds)
        differences = [s.difference for s in self.seeds]
        if self.verdict == HOLDS:
            why = f"every seed leads by more than the seeds' spread ({self.spread:.2f})"
        elif self.verdict == DOES_NOT_HOLD:
            why = f"every seed trails by more than the seeds' spread ({self.spread:.2f})"
        elif any(math.isnan(d) for d in differences):
            why = "a late mean is not a number (a run with a non-finite accuracy)"
        elif len(self.seeds) == 1:
            why = "one seed cannot tell a method from its seed"
        elif any(d == 0 for d in differences):
            why = "a seed's late means are equal (a tie)"
        elif min(differences) < 0 < max(differences):
            why = "the seeds disagree on the sign"
        else:
            smallest = min(abs(d) for d in differences)
            why = (f"the seeds agree on the sign but differ by {self.spread:.2f}, not less "
                   f"than the smallest difference in size ({smallest:.2f})")
        return (f"{a} > {b} {self.verdict}: {why}. Mean over {self.window()} of {a} minus "
                f"{b}, per seed: {per_seed}.")


def late_window(rounds: np.ndarray, share: float = LATE_SHARE) -> np.ndarray:
    """The last ``share`` of ``rounds`` (at least one)."""
    k = max(1, math.ceil(share * len(rounds)))
    return rounds[-k:]


def pair_reading(seed: int, a: Curve, b: Curve, share: float = LATE_SHARE
                 ) -> SeedReading | None:
    """One seed's late difference and leads over the evaluations both curves have."""
    ra, va, rb, vb = (np.asarray(x) for x in (*a, *b))
    common = np.intersect1d(ra, rb)
    if len(common) == 0:
        return None
    window = late_window(common, share)
    late_a = np.array([va[ra == r][0] for r in window], dtype=float)
    late_b = np.array([vb[rb == r][0] for r in window], dtype=float)
    return SeedReading(seed, float(late_a.mean() - late_b.mean()), int((late_a > late_b).sum()),
                       len(window), int(window[0]), int(window[-1]))


def read(a: Mapping[int, Curve], b: Mapping[int, Curve], share: float = LATE_SHARE) -> Reading:
    """The reading of "A > B" from each method's curve per seed (seeds both have)."""
    seeds = tuple(r for seed in sorted(set(a) & set(b))
                  if (r := pair_reading(seed, a[seed], b[seed], share)) is not None)
    if not seeds:
        return Reading(CANNOT_TELL, (), 0.0)
    differences = [s.difference for s in seeds]
    spread = float(max(differences) - min(differences))
    if len(seeds) >= 2 and all(d > spread and d > 0 for d in differences):
        verdict = HOLDS
    elif len(seeds) >= 2 and all(d < -spread and d < 0 for d in differences):
        verdict = DOES_NOT_HOLD
    else:
        verdict = CANNOT_TELL
    return Reading(verdict, seeds, spread)


def claim_line(setting: Sequence[str], claim: str, result: Reading, note: str = "") -> str:
    """One line per claim, as ``tables`` and the notebooks' answers print it: the setting,
    the claim, the verdict and each seed's late difference (then ``note``, e.g. a
    divergence)."""
    per_seed = ", ".join(f"{s.difference:+.2f}" for s in result.seeds) or "no seed"
    return (f"{', '.join(map(str, setting))}: {claim} {result.verdict} "
            f"(late difference per seed: {per_seed})" + (f"; {note}" if note else ""))


def diverged_note(stops: Mapping[str, Mapping[int, int]]) -> str:
    """What a reading must say when a run diverged (its loss became NaN or infinite and the
    run stopped): method -> seed -> the round it stopped at. The late window then lies
    before the divergence, and a verdict there says nothing about the rounds after, where
    that method has no usable model; '' when nothing diverged."""
    parts = [f"{method} diverged in seed{'s' if len(seeds) > 1 else ''} "
             + ", ".join(f"{seed} (round {last})" for seed, last in sorted(seeds.items()))
             for method, seeds in stops.items() if seeds]
    if not parts:
        return ""
    return "; ".join(parts) + ": read over the evaluations before, and it has no model after"

