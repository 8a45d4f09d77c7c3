"""The one-line run status: frame rates, returns, lag, and a progress bar towards the stop limit."""

from __future__ import annotations

from collections.abc import Mapping

from sfbus import RunLimits

_BAR_WIDTH = 20


def human(n: float) -> str:
    """``1234567`` as ``1.2M``, ``4321`` as ``4.3k``."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}"
    return f"{n:.0f}"


def duration(seconds: float) -> str:
    """``3725`` as ``1:02:05``, ``65`` as ``1:05``."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_bar(limits: RunLimits, frames: int, elapsed: float, fps: float) -> str:
    """``[#####---------------] 25% 250k/1.0M frames ETA 4:10``, or '' without a limit.

    With both limits, the one that will be reached first decides.
    """
    candidates = []
    if limits.max_frames:
        eta = (limits.max_frames - frames) / fps if fps > 0 else float("inf")
        candidates.append((eta, frames / limits.max_frames,
                           f"{human(frames)}/{human(limits.max_frames)} frames"))
    if limits.max_seconds:
        candidates.append((limits.max_seconds - elapsed, elapsed / limits.max_seconds,
                           f"{duration(elapsed)}/{duration(limits.max_seconds)}"))
    if not candidates:
        return ""
    eta, fraction, what = min(candidates)
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * _BAR_WIDTH)
    eta_text = duration(eta) if eta != float("inf") else "?"
    return f"[{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] {fraction:4.0%} {what} ETA {eta_text}"


def status_line(frames: int, fps: Mapping[str, float], policies: Mapping[str, Mapping],
                bar: str = "", show_stats: tuple[str, ...] = ()) -> str:
    """The compact status: progress, frame rates, then per policy reward, the env's extra
    stats named in ``show_stats``, lag and version."""
    parts = [bar] if bar else [f"{human(frames)} frames"]
    parts.append("fps " + " ".join(f"{human(v)} ({k})" for k, v in fps.items()))
    for policy, entry in policies.items():
        text = f"p{policy}"
        if "reward" in entry:
            text += f" reward {entry['reward']:.2f}"
        if "true_reward" in entry:
            text += f" true {entry['true_reward']:.2f}"
        extra = entry.get("extra_stats", {})
        text += "".join(f" {name} {extra[name]:.2f}" for name in show_stats if name in extra)
        if "version" in entry:
            text += f" v{entry['version']} lag {entry['lag']:.1f}"
        if "fps_share" in entry:
            text += f" {entry['fps_share']:.0%} of fps"
        parts.append(text)
    return " | ".join(parts)
