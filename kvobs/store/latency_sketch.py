"""The latency sketch the `latency_minutes` rollup keeps (the DDSketch construction: Masson, Rim and Lee, VLDB 2019):
each latency falls in a logarithmic bin, bins of any windows merge by adding their counts, and any quantile read off
the merged bins is within `SKETCH_ACCURACY` of the exact one.

    bins = value_bins(ttft_s)       # the bin of each value (`ZERO_BIN` for zero)
    values = bin_values(bins)       # the value each bin stands for
"""

from __future__ import annotations

import math

import numpy as np

SKETCH_ACCURACY = 0.01  # relative: a sketched quantile is within 1% of the exact one
_GAMMA = (1 + SKETCH_ACCURACY) / (1 - SKETCH_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
MIN_SKETCHED_S = 1e-6  # values at or below it (a zero TTFT, clock skew) fall in the zero bin, read as 0
ZERO_BIN = -(2**15)
BIN_SPAN = 2**16  # value bins lie in [ZERO_BIN, -ZERO_BIN): a bin as an offset in a combined key


def value_bins(values: np.ndarray) -> np.ndarray:
    """Each value's sketch bin: k with gamma^(k-1) < value <= gamma^k; `ZERO_BIN` at or below `MIN_SKETCHED_S`."""
    values = np.asarray(values, float)
    out = np.full(values.shape, ZERO_BIN, dtype=np.int64)
    positive = values > MIN_SKETCHED_S
    out[positive] = np.ceil(np.log(values[positive]) / _LOG_GAMMA - 1e-12).astype(np.int64)
    return out


def bin_values(bins: np.ndarray) -> np.ndarray:
    """The value a bin stands for: 2 gamma^k / (gamma + 1), within `SKETCH_ACCURACY` of every value in it; 0 for
    the zero bin."""
    bins = np.asarray(bins, np.int64)
    out = 2.0 * np.exp(bins.astype(float) * _LOG_GAMMA) / (_GAMMA + 1.0)
    return np.where(bins == ZERO_BIN, 0.0, out)
