"""Where the model's time goes: a learner step and an inference step, float32 vs bfloat16.

``python -m bench.arithmetic [--write-docs]`` times, in this process with one torch thread (as
the learner and the inference worker run), the phases of one APPO step on a doom_basic-sized
batch (32 trajectories x 32 steps of 3x72x128 frames, the default conv + GRU 512 model):
normalizing the observations, forward pass and loss (GAE's targets first, from V(x_T), then
the loss over the 32 steps, as the learner computes them), backward pass, clipping and Adam;
and one inference step (normalization included) at 8, 16 and 32 rows, eager and on packed
weights.
Each configuration is timed alternately, so machine noise hits them alike, and reported as the
median of ``--repeats`` runs. ``--duel`` adds the self-play duel's packed step (the ``full``
model over frames and measurements) at 1, 2 and 8 rows, 4 policies taken in turn as a rollout
process of ``topologies/selfplay_duel.yaml`` serves them, so their weights do not stay in cache.
``--ops`` adds, for the bfloat16 learner step and the packed bfloat16 inference step of 16 rows,
the operators that take most of their time (torch's profiler, self time per call of the step).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable

import torch

from bench import throughput
from bench.report import write_section
from sfbus.heap import keep_freed_memory
from sfbus_components.algo import AppoConfig, appo_loss, gae_targets
from sfbus_components.datapath.settings import DataPathParams, build_policy
from sfbus_components.envs import env_spec
from sfbus_components.models import ActorCritic, ModelConfig
from sfbus_components.models.normalizers import ObsNormalizer, ReturnsNormalizer

DOC = "arithmetic.md"
SECTION = "## Where the time goes: the model's arithmetic"
IMAGE = (3, 72, 128)
PRECISIONS = ("float32", "bfloat16")
INFERENCE = (*PRECISIONS, *(f"{p}, packed" for p in PRECISIONS))
"""Inference kinds: each precision eager, then on packed weights (models/packed.py)."""
PHASES = ("normalize", "forward + loss", "backward", "clip + Adam")
DOOM_BASIC_LOSSES = AppoConfig(with_vtrace=False, exploration_loss="symmetric_kl",
                               entropy_coeff=0.001, ppo_clip_value=0.2)
"""``topologies/doom_basic.yaml``'s losses (GAE, symmetric-KL exploration, value clip)."""


def make_model(precision: str) -> ActorCritic:
    """The default doom_basic model with the given encoder precision."""
    torch.manual_seed(0)
    return ActorCritic({"obs": (IMAGE, "uint8")}, (3,), None,
                       ModelConfig(precision=precision, policy_init_gain=1.0))


class LearnerStep:
    """One APPO step on a fixed random batch, timed phase by phase."""

    def __init__(self, precision: str, trajectories: int = 32, steps: int = 32) -> None:
        self.model = make_model(precision)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4, fused=True)
        self.normalizer = ObsNormalizer({"obs": (IMAGE, "uint8")})
        self.returns = ReturnsNormalizer()
        b, t = trajectories, steps
        self.steps = t
        self.raw = torch.randint(0, 256, (b, t + 1, *IMAGE), dtype=torch.uint8)
        self.batch = {"rnn": torch.zeros(b, t + 1, 512), "actions": torch.randint(0, 3, (b, t, 1)),
                      "log_probs": torch.full((b, t), -1.1), "values": torch.zeros(b, t),
                      "rewards": torch.randn(b, t), "dones": torch.zeros(b, t),
                      "action_params": torch.zeros(b, t, 3)}
        self.samples = b * t

    def run(self) -> list[float]:
        """Seconds of each phase of one step."""
        marks = [time.perf_counter()]
        stats = self.normalizer.stats["obs"]
        stats.update(self.raw[:, : self.steps : 8])  # as the learner: every 8th step's frames
        image_dtype = self.model.encoder.compute_dtype(self.raw.device)  # as the learner,
        threads = self.model.sequence_threads  # as the learner: frames by trajectory
        obs = {"obs": stats.normalize(self.raw[:, : self.steps], image_dtype, threads)}  # T apart
        last = {"obs": stats.normalize(self.raw[:, self.steps :], image_dtype, threads)}
        marks.append(time.perf_counter())
        batch = {**self.batch, "obs": obs}
        targets, advantages = gae_targets(self.model, batch, DOOM_BASIC_LOSSES, self.returns,
                                          last)
        loss, _ = appo_loss(self.model, {**batch, "targets": targets, "advantages": advantages},
                            DOOM_BASIC_LOSSES, self.returns)
        marks.append(time.perf_counter())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        marks.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 4.0)
        self.optimizer.step()
        marks.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(marks)]


def inference_pass(kind: str, rows: int) -> Callable[[], None]:
    """One inference step of ``rows`` rows as the inference worker runs it (``Policy.step``:
    uint8 frames normalized, then the model, eager or on packed weights: ``kind`` is one of
    :data:`INFERENCE`)."""
    torch.manual_seed(0)
    precision, _, packed = kind.partition(", ")
    policy = build_policy(DataPathParams(env="doom_basic", model=ModelConfig(precision=precision)))
    policy.prepare_for_inference(packed=packed == "packed")
    obs = {"obs": torch.randint(0, 256, (rows, *IMAGE), dtype=torch.uint8)}
    state = torch.zeros(rows, policy.model.state_size)

    def run() -> None:
        with torch.inference_mode():
            policy.step(obs, state)
    return run


def duel_passes(rows: tuple[int, ...], policies: int = 4) -> dict[str, Callable[[], None]]:
    """Packed ``Policy.step`` calls on the duel's model, one per row count in ``rows``; every
    call, whatever its rows, takes the next of ``policies`` policies (a self-play rollout
    process serves several policies one or two rows at a time)."""
    params = DataPathParams(env="doom_duel", model=ModelConfig(architecture="full"))
    served = []
    for seed in range(policies):
        torch.manual_seed(seed)
        served.append(build_policy(params).prepare_for_inference())
    turn = itertools.cycle(served)
    fields = env_spec("doom_duel").observation_space.items()

    def run_for(n: int) -> Callable[[], None]:
        obs = {key: torch.randint(0, 256, (n, *f.shape), dtype=torch.uint8)
               if f.dtype == "uint8" else torch.randn(n, *f.shape) for key, f in fields}
        state = torch.zeros(n, served[0].model.state_size)

        def run() -> None:
            with torch.inference_mode():
                next(turn).step(obs, state)
        return run
    return {str(n): run_for(n) for n in rows}


def median_times(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, object]:
    """Call every run ``repeats`` times, interleaved; the median of each (per phase if a list)."""
    samples: dict[str, list[object]] = {name: [] for name in runs}
    for run in runs.values():  # warm-up: allocator, oneDNN kernels
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            result = run()
            samples[name].append(result if isinstance(result, list)
                                 else time.perf_counter() - start)
    out: dict[str, object] = {}
    for name, values in samples.items():
        if isinstance(values[0], list):
            out[name] = [statistics.median(v[i] for v in values)  # type: ignore[index]
                         for i in range(len(values[0]))]  # type: ignore[arg-type]
        else:
            out[name] = statistics.median(values)  # type: ignore[type-var]
    return out


def top_operators(run: Callable[[], object], calls: int, top: int = 8) -> list[tuple[str, float]]:
    """The ``top`` operators by self CPU time over ``calls`` calls of ``run`` (after one
    unprofiled call), as (name, seconds per call), then everything else as ``other``."""
    run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            run()
    ops = sorted(((e.key, e.self_cpu_time_total / 1e6 / calls) for e in prof.key_averages()),
                 key=lambda op: -op[1])
    return [*ops[:top], ("other", sum(seconds for _, seconds in ops[top:]))]


def operator_table(title: str, ops: list[tuple[str, float]]) -> list[str]:
    """Markdown rows of :func:`top_operators`' result: time per call and share."""
    total = sum(seconds for _, seconds in ops)
    return ["", f"| {title} | per call | share |", "| --- | ---: | ---: |",
            *(f"| `{name}` | {seconds * 1e3:.2f} ms | {seconds / total:.0%} |"
              for name, seconds in ops),
            f"| **total** | **{total * 1e3:.2f} ms** | |"]


def main(argv: list[str] | None = None) -> int:
    """Time both precisions, print the tables, optionally rewrite the docs section."""
    parser = argparse.ArgumentParser(prog="python -m bench.arithmetic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per configuration")
    parser.add_argument("--duel", action="store_true",
                        help="also time the self-play duel's packed step, 4 policies in turn")
    parser.add_argument("--ops", action="store_true",
                        help="also list the operators that take most of a step's time")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the docs section")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_memory()  # as the learner
    steps = {p: LearnerStep(p) for p in PRECISIONS}
    learner = median_times({p: s.run for p, s in steps.items()}, args.repeats)
    samples = steps["float32"].samples
    rows = ["| learner step phase | " + " | ".join(PRECISIONS) + " |",
            "| --- |" + " ---: |" * len(PRECISIONS)]
    for i, phase in enumerate(PHASES):
        rows.append(f"| {phase} | " + " | ".join(f"{learner[p][i] * 1e3:.0f} ms"  # type: ignore
                                                 for p in PRECISIONS) + " |")
    totals = {p: sum(learner[p]) for p in PRECISIONS}  # type: ignore[arg-type]
    rows.append("| **whole step** | " + " | ".join(
        f"**{totals[p] * 1e3:.0f} ms** ({samples / totals[p]:,.0f} samples/s)"
        for p in PRECISIONS) + " |")
    passes = {f"{k}/{n}": inference_pass(k, n) for n in (8, 16, 32) for k in INFERENCE}
    times = median_times(passes, args.repeats * 5)
    rows += ["", "| inference step | " + " | ".join(INFERENCE) + " |",
             "| --- |" + " ---: |" * len(INFERENCE)]
    for n in (8, 16, 32):
        rows.append(f"| {n} rows | " + " | ".join(
            f"{times[f'{k}/{n}'] * 1e3:.2f} ms ({n / times[f'{k}/{n}']:,.0f} rows/s)"  # type: ignore
            for k in INFERENCE) + " |")
    if args.duel:
        duel_rows = (1, 2, 8)
        duel = median_times(duel_passes(duel_rows), args.repeats * 100)
        rows += ["", "| duel step (packed, 4 policies in turn) | time |", "| --- | ---: |"]
        rows += [f"| {n} rows | {duel[str(n)] * 1e6:.0f} us |" for n in duel_rows]  # type: ignore
    if args.ops:
        rows += operator_table("bfloat16 learner step: operator",
                               top_operators(steps["bfloat16"].run, args.repeats))
        rows += operator_table("bfloat16, packed inference step of 16 rows: operator",
                               top_operators(passes["bfloat16, packed/16"], args.repeats * 50))
    text = "\n".join(rows)
    print(text)
    if args.write_docs:
        command = "python -m bench.arithmetic " + " ".join(sys.argv[1:] if argv is None else argv)
        about = ("One torch thread, as in the learner and the inference worker; medians of "
                 f"{args.repeats} interleaved runs (inference: {args.repeats * 5}). `bfloat16` "
                 "is `model.precision: bfloat16` (the default `auto` on this CPU): the encoder "
                 "under autocast with channels-last convolutions, the GRU's matrix products in "
                 "bfloat16 in the learner and the packed step, its gates and state and the "
                 "heads in float32 (the eager inference step keeps a float32 GRU). An "
                 "inference step includes normalizing the uint8 frames; a `packed` kind is "
                 "what the inference worker runs (`sfbus_components/models/packed.py`: the "
                 "learner's "
                 "precisions on weights reordered once for oneDNN; `bfloat16, packed` with the "
                 "default `auto` on a CPU with fast bfloat16, `float32, packed` elsewhere), "
                 "`bfloat16` the eager model with the encoder's weights kept in bfloat16.")
        write_section(DOC, SECTION, f"Command: `{command.strip()}`\n\nMachine: "
                      f"{throughput.machine()}\n\n{about}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
