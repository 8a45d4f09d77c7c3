"""Numbers an env reports at an episode's end, ``info["episode_extra_stats"]`` (Sample Factory's
key): a dict of name -> number, averaged per policy like the reward by every report.

What an env may send is bounded here, where the episode ends, so that a buggy env cannot flood the
reports or the metrics: at most :data:`MAX_EXTRA_STATS` names of at most :data:`MAX_NAME_LENGTH`
characters (letters, digits, ``_ . - /``; a ``/`` makes the name its own TensorBoard tag), each a
finite real number. A bad entry is dropped with a rate-limited warning; the episode still counts.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from sfbus import RateLimitedLog

EXTRA_STATS_KEY = "episode_extra_stats"
"""The info key of the numbers (in the info of the step that ended the episode)."""
MAX_EXTRA_STATS = 32
"""Names one episode may report; the further ones are dropped."""
MAX_NAME_LENGTH = 64
"""Characters of a name (a TensorBoard tag and a Prometheus label value)."""
MAX_NAMES_PER_POLICY = 128
"""Names the reports keep per policy over a run (Prometheus series); DMLab-30's per-level
scores, Sample Factory's example of such stats, take 60."""
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")
_warn = RateLimitedLog(logging.getLogger(__name__), 60.0)


def episode_extra_stats(info: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    """The valid (name, value) pairs of ``info``'s extra stats; () when it has none."""
    extra = info.get(EXTRA_STATS_KEY)
    if not extra:
        return ()
    if not isinstance(extra, Mapping):
        _warn.warning("type", "an env's info[%r] is a %s, not a dict of name -> number: dropped",
                      EXTRA_STATS_KEY, type(extra).__name__)
        return ()
    kept: list[tuple[str, float]] = []
    for name, value in extra.items():
        if len(kept) == MAX_EXTRA_STATS:
            _warn.warning("count", "an env reported more than %d %s: the rest are dropped",
                          MAX_EXTRA_STATS, EXTRA_STATS_KEY)
            break
        if not (isinstance(name, str) and len(name) <= MAX_NAME_LENGTH and _NAME.fullmatch(name)):
            _warn.warning("name", "%s name %.80r dropped: names are up to %d letters, digits "
                          "and _ . - /", EXTRA_STATS_KEY, name, MAX_NAME_LENGTH)
            continue
        # numpy's scalars are numbers.Real too; a string or an array is not a number
        number = float(value) if isinstance(value, numbers.Real) else math.nan
        if not math.isfinite(number):
            _warn.warning("value", "%s[%r] = %.80r dropped: not a finite number",
                          EXTRA_STATS_KEY, name, value)
            continue
        kept.append((name, number))
    return tuple(kept)
