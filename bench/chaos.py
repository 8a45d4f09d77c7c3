"""A chaos soak of doom_basic: random SIGKILL and SIGSTOP of any of the run's processes, an env
that raises at random, a checkpoint folder that cannot be written for a while.

``python -m bench.chaos [--minutes 30] [--every 20,60] [--seed 0] [--write-docs]``; not in CI, it
takes the machine for the whole run. Every 20-60 s (uniform) one process of the run gets SIGKILL or
SIGSTOP (even odds), chosen at random, with even odds, among its children (the rollout processes
with their inference workers, the learner) or among their VizDoom engines; a stopped one gets
SIGCONT 5-20 s later in half the cases, otherwise it stays stopped for the supervisor's heartbeat
or the env-step watchdog to find. The envs are doom_basic behind :func:`flaky_doom_basic`, which
raises from a step with probability ``RAISE_P``. A third of the way in, the policy's checkpoint
folder is replaced by a file for ``BLOCKED_S`` (longer than doom_basic's checkpoint interval), then
put back. The bench samples ``progress.jsonl`` every second and the score of ``best/`` whenever it
changes. It passes when the run ends by its own ``--max-seconds`` with exit 0, env frames and the
policy version never stood still longer than the run's ``progress_timeout_s``, the best
checkpoint's score never fell, and no process or shared-memory segment of the run is left.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.process import stop_gracefully
from bench.report import machine, write_section
from bench.soak import last_record, run_processes
from sfbus.procfs import run_children
from sfbus_components.envs.registry import make_env
from sfbus_components.envs.spec import EnvSpec, MultiAgentEnv, ObsDict, StepOutput

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = "topologies/doom_basic.yaml"
DOC = "soaks.md"
SECTION = "## Chaos soak: doom_basic under random kills and stops"
RAISE_P = 1e-5
"""Probability that a step of :func:`flaky_doom_basic` raises: about once a minute or two over
all of doom_basic's 32 envs on two cores."""
BLOCKED_S = 75.0
"""How long the checkpoint folder stays replaced: past doom_basic's 60 s checkpoint interval."""
MARGIN_S = 20.0  # --max-seconds past the bench's own clock, which starts at the first frames
PROGRESS_TIMEOUT_S = 300.0  # run.progress_timeout_s, which doom_basic leaves at its default


class _Flaky(MultiAgentEnv):
    """An env whose steps raise with probability ``RAISE_P``."""

    def __init__(self, env: MultiAgentEnv) -> None:
        self.env = env
        self.rng = random.Random()

    @property
    def spec(self) -> EnvSpec:
        """The wrapped env's spec."""
        return self.env.spec

    def reset_into(self, obs_out: ObsDict, seed: int | None = None) -> None:
        """Reset the wrapped env."""
        self.env.reset_into(obs_out, seed)

    def step_into(self, actions: np.ndarray, obs_out: ObsDict) -> StepOutput:
        """Step the wrapped env, or raise at random."""
        if self.rng.random() < RAISE_P:
            raise RuntimeError("chaos: an env step raising at random")
        return self.env.step_into(actions, obs_out)

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()


def flaky_doom_basic(**kwargs: Any) -> MultiAgentEnv:
    """doom_basic whose steps raise at random (``env: bench.chaos:flaky_doom_basic``)."""
    return _Flaky(make_env("doom_basic", **kwargs))


@dataclass
class Chaos:
    """What the bench did and saw."""

    events: list[str] = field(default_factory=list)
    progress: list[tuple[float, int, int]] = field(default_factory=list)  # t, frames, version
    best: list[tuple[float, float]] = field(default_factory=list)  # t, best/'s score
    stopped: list[tuple[float, int]] = field(default_factory=list)  # SIGCONT due: t, pid


def best_score(folder: Path) -> float | None:
    """The score the checkpoint in ``folder`` (``best/``) carries, or None."""
    import torch

    found = sorted(folder.glob("checkpoint_*.pt"))
    if not found:
        return None
    with contextlib.suppress(Exception):  # being replaced right now: read it next time
        state = torch.load(found[-1], map_location="cpu", weights_only=True)
        return float(state["best"]["score"])
    return None


def longest_stall(points: list[tuple[float, int]]) -> float:
    """The longest time over which the value did not rise (from its first rise on)."""
    longest, since, top = 0.0, None, None
    for t, value in points:
        if top is None or value > top:
            if since is not None:
                longest = max(longest, t - since)
            since, top = t, value
    return max(longest, points[-1][0] - since) if since is not None else 0.0


def victims(run_dir: Path) -> dict[int, str]:
    """The run's processes a fault may hit, by pid: its children and their engines (each child
    leads its own process group, which its engines share; the supervisor is in none)."""
    children = run_children(run_dir)
    names = {pid: name for name, pid in children.items()}
    return {pid: names.get(pid, "engine") for pid in run_processes(-1, set(children.values()))}


def strike(rng: random.Random, run_dir: Path, now: float, chaos: Chaos) -> None:
    """SIGKILL or SIGSTOP one process of the run, chosen at random."""
    targets = victims(run_dir)
    # Half the faults hit a child, half an engine: by head count the 32 engines would take
    # nearly all of them.
    children = sorted(p for p, name in targets.items() if name != "engine")
    engines = sorted(p for p, name in targets.items() if name == "engine")
    pool = children if children and (not engines or rng.random() < 0.5) else engines
    if not pool:
        return
    pid = rng.choice(pool)
    kind = rng.choice(("SIGKILL", "SIGSTOP"))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, getattr(signal, kind))
        note = ""
        if kind == "SIGSTOP" and rng.random() < 0.5:
            due = now + rng.uniform(5, 20)
            chaos.stopped.append((due, pid))
            note = f", SIGCONT at {due:.0f} s"
        chaos.events.append(f"{now:.0f} s: {kind} {targets[pid]} (pid {pid}){note}")


def run(args: argparse.Namespace, tmp: Path) -> tuple[Chaos, int, list[int], list[str], str]:
    """Run doom_basic under chaos; what happened, its exit code, and what it left behind."""
    run_dir, log = tmp / "run", tmp / "output.txt"
    length = args.minutes * 60
    rng = random.Random(args.seed)
    low, high = args.every
    chaos = Chaos()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sfbus", "run", TOPOLOGY, "--run-dir", str(run_dir),
             "--max-seconds", str(length + MARGIN_S), "--set", "env=bench.chaos:flaky_doom_basic",
             "--set", f"seed={args.seed}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    groups: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while last_record(run_dir).get("env_frames", 0) <= 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"no env frames from the run:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        t0 = time.monotonic()
        next_strike, next_sample, seen = rng.uniform(low, high), 0.0, None
        folder = run_dir / "checkpoints" / "policy_0"
        block_at, unblock_at = length / 3, length / 3 + BLOCKED_S
        while proc.poll() is None:
            now = time.monotonic() - t0
            groups |= set(run_children(run_dir).values())
            if now >= next_sample:
                record = last_record(run_dir)
                chaos.progress.append((now, record.get("env_frames", 0), record.get(
                    "policies", {}).get("0", {}).get("version", 0)))
                best = folder / "best"
                stamp = max((p.stat().st_mtime for p in best.glob("*.pt")), default=None) \
                    if best.is_dir() else None
                if stamp is not None and stamp != seen and (score := best_score(best)) is not None:
                    seen = stamp
                    chaos.best.append((now, score))
                next_sample += 1.0
            for due, pid in [s for s in chaos.stopped if s[0] <= now]:
                chaos.stopped.remove((due, pid))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            if now >= next_strike and now < length - high:
                strike(rng, run_dir, now, chaos)
                next_strike = now + rng.uniform(low, high)
            if block_at is not None and now >= block_at and folder.is_dir():
                folder.rename(folder.with_name("policy_0.away"))
                folder.write_text("not a folder")
                chaos.events.append(f"{now:.0f} s: checkpoint folder replaced by a file for "
                                    f"{BLOCKED_S:g} s")
                block_at = None
            if block_at is None and unblock_at is not None and now >= unblock_at:
                folder.unlink()
                folder.with_name("policy_0.away").rename(folder)
                chaos.events.append(f"{now:.0f} s: checkpoint folder back")
                unblock_at = None
            time.sleep(0.2)
        code = proc.wait()
    finally:
        for _, pid in chaos.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        stop_gracefully(proc)
    time.sleep(1)
    leftovers = run_processes(-1, groups)
    segments = [n for n in os.listdir("/dev/shm") if n.startswith(f"sfbus-{proc.pid}-")]
    return chaos, code, leftovers, segments, log.read_text()


def verdict(chaos: Chaos, code: int, leftovers: list[int], segments: list[str],
            output: str) -> tuple[str, bool]:
    """The figures of the soak and whether it passed."""
    frames = longest_stall([(t, f) for t, f, _ in chaos.progress])
    versions = longest_stall([(t, v) for t, _, v in chaos.progress])
    scores = [s for _, s in chaos.best]
    fell = [(a, b) for a, b in itertools.pairwise(scores) if b < a]
    counts = {kind: sum(kind in e for e in chaos.events) for kind in ("SIGKILL", "SIGSTOP")}
    restarts = len(re.findall(r"exited with code \S+; restarting", output))
    lines = [
        f"faults: {counts['SIGKILL']} SIGKILL, {counts['SIGSTOP']} SIGSTOP "
        f"({sum('SIGCONT' in e for e in chaos.events)} of them resumed), the checkpoint folder "
        f"replaced for {BLOCKED_S:g} s; env steps that raised: "
        f"{output.count('chaos: an env step raising at random')} (lines of the run's output "
        f"naming one); process restarts: {restarts}; processes killed "
        f"for a silent heartbeat: {output.count('stopped heart-beating')}",
        f"longest stall of env frames: {frames:.0f} s; of the policy version: {versions:.0f} s "
        f"(the watchdog's limit: {PROGRESS_TIMEOUT_S:g} s)",
        f"best checkpoint: {len(scores)} scores seen, from {scores[0]:.3f} to {scores[-1]:.3f}"
        if scores else "best checkpoint: none written",
        f"best checkpoint's score fell {len(fell)} times" + (f": {fell}" if fell else ""),
        f"exit code {code}; left behind: {len(leftovers)} processes, {len(segments)} shared-memory"
        " segments",
        f"env frames at the end: {chaos.progress[-1][1]:,}, version {chaos.progress[-1][2]}"
        if chaos.progress else "no progress recorded",
    ]
    ok = (code == 0 and not leftovers and not segments and not fell
          and max(frames, versions) < PROGRESS_TIMEOUT_S)
    return "\n".join(f"- {line}" for line in lines), ok


def main(argv: list[str] | None = None) -> int:
    """Run the chaos soak, print its figures, optionally record them."""
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="length after first frames")
    parser.add_argument("--every", default="20,60", help="seconds between faults: LOW,HIGH")
    parser.add_argument("--seed", type=int, default=0, help="the faults' and the run's seed")
    parser.add_argument("--write-docs", action="store_true",
                        help="record in docs/benchmarks/soaks.md")
    args = parser.parse_args(argv)
    args.every = tuple(float(x) for x in args.every.split(","))
    if len(args.every) != 2 or not 0 < args.every[0] <= args.every[1] < math.inf:
        parser.error("--every takes LOW,HIGH seconds, 0 < LOW <= HIGH")
    with tempfile.TemporaryDirectory(prefix="sfbus-chaos-") as tmp:
        chaos, code, leftovers, segments, output = run(args, Path(tmp))
        if code != 0:
            print(output[-3000:], file=sys.stderr)
    summary, ok = verdict(chaos, code, leftovers, segments, output)
    events = "\n".join(f"- {e}" for e in chaos.events)
    print(f"{events}\n\n{summary}\n{'passed' if ok else 'FAILED'}")
    if args.write_docs:
        import torch
        import vizdoom

        command = "python -m bench.chaos " + " ".join(argv if argv is not None else sys.argv[1:])
        versions = f"torch {torch.__version__}, vizdoom {vizdoom.__version__}"
        write_section(DOC, SECTION,
                      f"Command: `{command.strip()}`\n\nMachine: {machine(versions)}\n\n"
                      f"{__doc__.split(chr(10) + chr(10), 1)[1].strip()}\n\n"
                      f"Result: **{'passed' if ok else 'FAILED'}**\n\n{summary}\n\n"
                      f"<details><summary>The faults, in order</summary>\n\n{events}\n\n"
                      "</details>\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
