"""Rate-limited warnings for hot paths: the first is logged, repeats counted and summarised."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """Logs a warning at most once per ``interval_s`` per key, with how many were suppressed."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: object) -> None:
        """Log ``message`` unless ``key`` was logged less than ``interval_s`` ago."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        suppressed = self._suppressed.pop(key, 0)
        self._last[key] = now
        if suppressed:
            message += f" ({suppressed} similar suppressed)"
        self.logger.warning(message, *args)
