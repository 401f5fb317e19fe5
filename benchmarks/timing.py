"""The one timing helper every benchmark uses (ARCHITECTURE.md, "Measuring").

    results = measure({"arke": lambda: lib.rmsnorm(x, w), "torch": lambda: ref(x, w)}, budget_s=10)
    results["arke"].median, results["arke"].spread, results["arke"].summary()

Discipline:

1. **Warm every candidate equally**: the same number of untimed calls each.
2. **Time them interleaved** (A, B, A, B, ...), so drift in clock speed, other tenants or
   memory state hits every candidate alike. A call shorter than ``min_sample_s`` is repeated
   inside one sample (the sample is divided by the repeat count), so timer overhead and noise
   stay small; a long call is one sample.
3. **Report the median and the spread**: the interquartile range over the median (robust
   to the odd preempted sample on a shared machine); ``(max - min) / median`` below 4 samples.
4. **Re-measure close calls**: when the first two candidates' medians are within
   ``recheck`` (5 %), more interleaved rounds are run before the result is returned
   (``Measurement.rechecked``), as long as the budget allows.

``budget_s`` bounds the time spent after warm-up: rounds stop when the next round would
overrun it (there is always one round, so a single slow call still gets one sample).
Nothing here asserts anything: it is for reports, never for tests.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Measurement", "format_seconds", "measure"]


@dataclass(frozen=True)
class Measurement:
    """The timed samples of one candidate, in seconds per call."""

    name: str
    samples: tuple[float, ...]
    repeat: int = 1  # calls per sample
    rechecked: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Interquartile range / median (``(max - min) / median`` under 4 samples; 0 for one)."""
        if len(self.samples) < 2:
            return 0.0
        if len(self.samples) < 4:
            return (max(self.samples) - min(self.samples)) / self.median
        q1, _, q3 = statistics.quantiles(self.samples, n=4)
        return (q3 - q1) / self.median

    def summary(self) -> str:
        """``"12.3 ms ±4%"``: the median and the spread."""
        return f"{format_seconds(self.median)} ±{self.spread * 100:.0f}%"


def format_seconds(seconds: float) -> str:
    """A duration with a unit that keeps 3 significant digits: ``812 µs``, ``12.3 ms``, ``4.06 s``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale or unit == "µs":
            value = seconds / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def _timed(fn: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def measure(candidates: Mapping[str, Callable[[], object]], *, budget_s: float, warmup: int = 1,
            max_rounds: int = 25, min_sample_s: float = 0.02, recheck: float = 0.05) -> dict[str, Measurement]:
    """Time each candidate, warmed equally and interleaved; see the module docstring.

    One round always runs; more (up to ``max_rounds``) while the next one fits in ``budget_s``.
    A close call gets up to as many rounds again, within another ``budget_s``.
    """
    names = list(candidates)
    estimate = dict.fromkeys(names, 0.0)
    for _ in range(max(1, warmup)):
        for name in names:
            estimate[name] = _timed(candidates[name], 1)
    repeat = {n: max(1, math.ceil(min_sample_s / max(estimate[n], 1e-9))) for n in names}
    samples: dict[str, list[float]] = {n: [] for n in names}

    def rounds(limit: int, deadline: float) -> None:
        last = sum(estimate[n] * repeat[n] for n in names)
        done = 0
        while done < limit:
            begin = time.perf_counter()
            if done and begin + last > deadline:
                break
            for name in names:
                samples[name].append(_timed(candidates[name], repeat[name]))
            last = time.perf_counter() - begin
            done += 1

    rounds(max_rounds, time.perf_counter() + budget_s)
    rechecked = False
    if len(names) >= 2:
        a, b = (statistics.median(samples[n]) for n in names[:2])
        if abs(a - b) <= recheck * max(a, b):
            rechecked = True
            rounds(len(samples[names[0]]), time.perf_counter() + budget_s)
    return {n: Measurement(n, tuple(samples[n]), repeat[n], rechecked) for n in names}
