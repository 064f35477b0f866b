"""A ratio from runs made in two orders, cancelling what the order itself adds.

On some lent GPU machines the side whose process started, and trained, first
ran up to about 10% faster (2026-12-04, twelfth session: 1 x 128 training
pairs read 0.87 to 0.94 with native first and 1.11 to 1.13 with flagos
first); on others no such skew showed, or flagos read lower when it went
first (thirteenth session). Either way, each order taking half the runs and
this combination keep the order from setting the ratio.
bench_qwen3_cuda.py's training rows and bench_decode_steps.py --processes
take their ratio through order_balanced()."""

import math
import statistics


def order_balanced(ratios, flagos_first):
    """The ratio of runs each made in one of two orders (flagos_first: per
    run, whether flagos went first). A plain median leans to whichever order
    has more runs; the geometric mean of the two orders' medians cancels a
    skew that scales the ratio by a constant factor. With runs of one order
    only it is their median."""
    by_order = {first: [r for r, f in zip(ratios, flagos_first) if f == first] for first in (False, True)}
    if not by_order[False] or not by_order[True]:
        return statistics.median(ratios)
    return math.sqrt(statistics.median(by_order[False]) * statistics.median(by_order[True]))
