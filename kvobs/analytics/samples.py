"""No statistic without its sample: the least data each derived figure needs before it is shown, and the figure with
the size of the sample it came from.

    quantile(ttfts, 0.99)                    # NaN with fewer than 100 values: p99 of 20 values is their maximum
    correlation(x, y)                        # Correlation(r, n, ci_low, ci_high, p): NaN r below MIN_PAIRS

Rules (one place, so every page and command applies the same):
- A q-quantile needs at least `ceil(1 / (1 - q))` values and never fewer than `MIN_QUANTILE_N`: below that there is
  no value above it to speak of (p99 of 20 requests is their maximum, p90 of 5 is too).
- A correlation needs at least `MIN_PAIRS` pairs and both series varying. Its 95% interval and p-value come from
  Fisher's z-transform (z = atanh r, standard error 1 / sqrt(n - 3)); consecutive time windows are not independent,
  so a small p is a lead to look at, not proof.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_QUANTILE_N = 5
MIN_PAIRS = 10
ALPHA = 0.05
_Z95 = 1.959963984540054


def min_sample(q: float) -> int:
    """The fewest values a q-quantile is shown for."""
    return max(MIN_QUANTILE_N, math.ceil(1.0 / (1.0 - q) - 1e-9)) if q < 1 else MIN_QUANTILE_N


def quantile(values, q: float) -> float:
    """The q-quantile of the known values (NaN skipped), or NaN when there are fewer than `min_sample(q)`."""
    known = pd.Series(values, dtype=float).dropna()
    return float(known.quantile(q)) if len(known) >= min_sample(q) else float("nan")


@dataclass(frozen=True)
class Correlation:
    """Pearson's r of `n` pairs with its 95% interval and two-sided p-value; NaNs when not shown (too few pairs, or
    a series that does not vary)."""

    r: float
    n: int
    ci_low: float
    ci_high: float
    p: float

    @property
    def shown(self) -> bool:
        return not math.isnan(self.r)


def correlation(x, y) -> Correlation:
    """Pearson's r of the pairs where both `x` and `y` are known, with Fisher's 95% interval and p-value."""
    pairs = pd.concat(
        [pd.Series(x, dtype=float).reset_index(drop=True), pd.Series(y, dtype=float).reset_index(drop=True)], axis=1
    ).dropna()
    n = len(pairs)
    nan = float("nan")
    if n < MIN_PAIRS or pairs.iloc[:, 0].std() == 0 or pairs.iloc[:, 1].std() == 0:
        return Correlation(nan, n, nan, nan, nan)
    r = float(np.corrcoef(pairs.iloc[:, 0], pairs.iloc[:, 1])[0, 1])
    clipped = min(max(r, -0.999999), 0.999999)
    z, se = math.atanh(clipped), 1.0 / math.sqrt(n - 3)
    p = math.erfc(abs(z) / se / math.sqrt(2.0))  # two-sided, normal approximation of z
    return Correlation(r, n, math.tanh(z - _Z95 * se), math.tanh(z + _Z95 * se), p)
