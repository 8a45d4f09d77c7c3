"""Signals between two processes: sfbus against ``multiprocessing.Queue`` and ``faster-fifo``.

``python -m bench.bus [--count N] [--quick] [--write-docs]`` runs every case one after another,
each in fresh processes: one-way throughput of small index messages and of batched ones (timed
in the receiver from its first receive to its last), and ping-pong round-trip latency. The sfbus
cases go through ``sfbus run`` on a generated topology, so they include the real supervisor,
bus, actors and decoding; the queue cases use two ``spawn`` processes.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import bus_actors
from bench.report import machine as machine_line
from bench.report import write_section

ROOT = Path(__file__).resolve().parent.parent
DOC = "bus.md"
SECTION = "## Bus: signals between two processes"
PUT_MANY = 256  # messages per faster-fifo put_many call
QUEUES = ("multiprocessing.Queue", "faster-fifo", "faster-fifo put_many")
ABOUT = """Every case runs in fresh processes, %(repeat)d times in interleaved order: the median
rate is shown (min-max at the end of *how*); round-trip percentiles pool every run. One-way rates
are timed in the receiver from its first receive to its last. sfbus runs under `sfbus run` on a
generated topology (`bench/bus_actors.py`): supervisor, bus, msgspec decoding and a sync slot per
message. Its sender emits `Index(slot, t)` or `IndexBatch(indices)` and awaits `flush()` every
*burst* emits: 64 is a rollout worker yielding after each half-step, 8192 a pure flood. The queues
carry the same payload as a tuple of ints between two `spawn` processes. Round trips keep one
message in flight, after 1,000 untimed ones; the pyzmq row (blocking PUSH/PULL, no asyncio, no
decoding) is the floor under sfbus's latency. The machine is shared, so figures are noisy."""


@dataclass
class Result:
    """One case's outcome: a rate (messages in seconds) or round-trip samples."""

    case: str
    system: str
    messages: int = 0
    seconds: float = 0.0
    indices: int = 1
    samples_ns: list[int] = field(default_factory=list)
    note: str = ""

    @property
    def rate(self) -> float:
        """Messages per second."""
        return (self.messages - 1) / self.seconds if self.seconds else 0.0


# ----- sfbus: the real CLI on a generated topology (see bench/bus_actors.py) ----------------

def sfbus_flood(count: int, batch: int, burst: int) -> Result:
    """One-way flood of ``count`` messages through the bus, actors and decoding included."""
    receiving, from_send, wall = bus_actors.sfbus_flood(count, batch, burst)
    note = (f"emit, `await flush()` every {burst}; from 1st send {count / from_send / 1e3:,.0f}k/s"
            f"; with start-up {count / wall / 1e3:,.0f}k/s")
    return Result("", f"sfbus (burst {burst})", count, receiving, max(batch, 1), note=note)


def sfbus_pingpong(rounds: int) -> Result:
    """Round trips of one small message through the bus and back."""
    return Result("round trip", "sfbus", samples_ns=bus_actors.sfbus_pingpong(rounds))


# ----- the queues: two spawn processes -------------------------------------------------------

def _new_queue(ctx: Any, system: str) -> Any:
    if system == "multiprocessing.Queue":
        return ctx.Queue()
    import faster_fifo
    import faster_fifo_reduction  # noqa: F401 - makes faster_fifo queues picklable for spawn

    return faster_fifo.Queue()


def _producer(q: Any, system: str, count: int, batch: int, ready: Any) -> None:
    ready.wait()
    indices = tuple(range(batch))
    if system.endswith("put_many"):
        for start in range(0, count, PUT_MANY):
            end = min(count, start + PUT_MANY)
            q.put_many([indices if batch else (i, 7) for i in range(start, end)])
    else:
        put = q.put
        for i in range(count):
            put(indices if batch else (i, 7))


def _consumer(q: Any, system: str, count: int, ready: Any, out: Any) -> None:
    ready.set()
    n, first, last = 0, 0.0, None
    if system.endswith("put_many"):
        get_many = q.get_many
        while n < count:
            items = get_many()
            if n == 0:
                first = time.monotonic()
            n += len(items)
            last = items[-1]
    else:
        get = q.get
        last = get()
        first, n = time.monotonic(), 1
        while n < count:
            last = get()
            n += 1
    out.send((n, first, time.monotonic(), last))


def queue_flood(system: str, count: int, batch: int) -> Result:
    """One-way flood of ``count`` tuples through a queue between two fresh processes."""
    ctx = mp.get_context("spawn")
    q, ready = _new_queue(ctx, system), ctx.Event()
    recv_end, send_end = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=_consumer, args=(q, system, count, ready, send_end)),
             ctx.Process(target=_producer, args=(q, system, count, batch, ready))]
    for p in procs:
        p.start()
    n, first, last_t, last = recv_end.recv()
    for p in procs:
        p.join()
    assert n == count and (len(last) == batch if batch else last[0] == count - 1), (n, last)
    note = f"put_many of {PUT_MANY}, get_many" if system.endswith("put_many") else "put, get"
    return Result("", system, count, last_t - first, max(batch, 1), note=note)


def _ponger(ping: Any, pong: Any, rounds: int) -> None:
    for _ in range(rounds):
        pong.put(ping.get())


def queue_pingpong(system: str, rounds: int, warmup: int = 1_000) -> Result:
    """Round trips of one small tuple through a pair of queues."""
    ctx = mp.get_context("spawn")
    ping, pong = _new_queue(ctx, system), _new_queue(ctx, system)
    proc = ctx.Process(target=_ponger, args=(ping, pong, warmup + rounds))
    proc.start()
    samples = []
    for i in range(warmup + rounds):
        sent = time.perf_counter_ns()
        ping.put((i, 0))
        assert pong.get()[0] == i
        if i >= warmup:
            samples.append(time.perf_counter_ns() - sent)
    proc.join()
    return Result("round trip", system, samples_ns=samples)


def _zmq_ponger(folder: str, rounds: int) -> None:
    import zmq

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(f"ipc://{folder}/pong")
    push.connect(f"ipc://{folder}/ping")
    for _ in range(rounds):
        push.send(pull.recv())
    ctx.destroy(linger=1000)


def zmq_pingpong(rounds: int, warmup: int = 1_000) -> Result:
    """The floor under sfbus: blocking pyzmq PUSH/PULL over ipc, no asyncio, no decoding."""
    import zmq

    with tempfile.TemporaryDirectory(prefix="sfbus-bench-") as folder:
        ctx = zmq.Context()
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        pull.bind(f"ipc://{folder}/ping")
        push.connect(f"ipc://{folder}/pong")
        proc = mp.get_context("spawn").Process(target=_zmq_ponger, args=(folder, warmup + rounds))
        proc.start()
        samples = []
        for i in range(warmup + rounds):
            sent = time.perf_counter_ns()
            push.send(b"\x92\x00\x00")
            pull.recv()
            if i >= warmup:
                samples.append(time.perf_counter_ns() - sent)
        proc.join()
        ctx.destroy(linger=0)
    return Result("round trip", "pyzmq PUSH/PULL, blocking (floor)", samples_ns=samples)


def merge(runs: list[Result]) -> Result:
    """One result from repeats: the median-rate run, or every round trip pooled."""
    if not runs[0].messages:
        return Result(runs[0].case, runs[0].system, samples_ns=[x for r in runs
                                                               for x in r.samples_ns])
    ordered = sorted(runs, key=lambda r: r.rate)
    mid = ordered[len(ordered) // 2]
    if len(runs) > 1:
        mid.note += (f"; median of {len(runs)} runs "
                     f"({ordered[0].rate / 1e3:,.0f}k-{ordered[-1].rate / 1e3:,.0f}k)")
    return mid


# ----- report ------------------------------------------------------------------------------

def percentile(samples: list[int], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples`` by nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def rate_table(results: list[Result]) -> str:
    """The one-way results as a Markdown table, with ratios to faster-fifo's two ways."""
    rows = ["| case | system | messages | messages/s | indices/s | vs faster-fifo put/get "
            "| vs put_many | how |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        ref, many = (next(x.rate for x in results if x.case == r.case and x.system == system)
                     for system in QUEUES[1:])
        rows.append(f"| {r.case} | {r.system} | {r.messages:,} | {r.rate / 1e3:,.0f}k | "
                    f"{r.rate * r.indices / 1e6:,.2f}M | {r.rate / ref:.2f}x | "
                    f"{r.rate / many:.2f}x | {r.note} |")
    return "\n".join(rows)


def latency_table(results: list[Result]) -> str:
    """The round-trip results as a Markdown table (microseconds)."""
    rows = ["| system | round trips | p50 µs | p99 µs | p50 vs faster-fifo |",
            "| --- | ---: | ---: | ---: | ---: |"]
    ref = percentile(next(r for r in results if r.system == "faster-fifo").samples_ns, 0.5)
    for r in results:
        p50, p99 = percentile(r.samples_ns, 0.5), percentile(r.samples_ns, 0.99)
        rows.append(f"| {r.system} | {len(r.samples_ns):,} | {p50 / 1e3:.1f} | {p99 / 1e3:.1f} "
                    f"| {p50 / ref:.2f}x |")
    return "\n".join(rows)


def machine() -> str:
    """This machine and the library versions this benchmark depends on."""
    from importlib.metadata import version

    import msgspec
    import zmq

    return machine_line(f"pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}, msgspec "
                        f"{msgspec.__version__}, uvloop {version('uvloop')}, faster-fifo "
                        f"{version('faster-fifo')}")


def write_docs(text: str) -> None:
    """Replace this benchmark's section of docs/benchmarks/bus.md."""
    write_section(DOC, SECTION, text)


def main(argv: list[str] | None = None) -> int:
    """Run every case in turn, print the tables, optionally rewrite the docs section."""
    parser = argparse.ArgumentParser(prog="python -m bench.bus", description=__doc__)
    parser.add_argument("--count", type=int, default=1_000_000, help="one-way small messages")
    parser.add_argument("--batch", type=int, default=32, help="indices per batched message")
    parser.add_argument("--rounds", type=int, default=20_000, help="timed round trips")
    parser.add_argument("--repeat", type=int, help="runs of each case, median shown (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20k messages, 2k trips")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks/bus.md")
    args = parser.parse_args(argv)
    count, rounds = (20_000, 2_000) if args.quick else (args.count, args.rounds)
    repeat = args.repeat or (1 if args.quick else 3)
    batched = max(2, count // 4)
    cases: list[tuple[str, Callable[[], Result]]] = []
    for case, n, b in (("small (slot, t)", count, 0), (f"batched ({args.batch} indices)",
                                                        batched, args.batch)):
        cases += [(case, lambda n=n, b=b: sfbus_flood(n, b, 8192)),
                  (case, lambda n=n, b=b: sfbus_flood(n, b, 64))]
        cases += [(case, lambda n=n, b=b, s=s: queue_flood(s, n, b)) for s in QUEUES]
    cases += [("round trip", lambda: sfbus_pingpong(rounds)),
              ("round trip", lambda: zmq_pingpong(rounds))]
    cases += [("round trip", lambda s=s: queue_pingpong(s, rounds)) for s in QUEUES[:2]]
    runs: dict[tuple[str, str], list[Result]] = {}
    for _ in range(repeat):  # repeats interleave, so that all systems share the noise
        for case, fn in cases:
            result = fn()
            result.case = result.case or case
            runs.setdefault((result.case, result.system), []).append(result)
            print(f"{result.case:>22} | {result.system:<34} | "
                  + (f"{result.rate / 1e3:,.0f}k msg/s" if result.messages else
                     f"p50 {percentile(result.samples_ns, 0.5) / 1e3:.1f} µs"), flush=True)
    results = [merge(r) for r in runs.values()]
    flows = [r for r in results if r.messages]
    small = {r.system: r.rate for r in flows if r.case == flows[0].case}
    low = min(v for k, v in small.items() if k.startswith("sfbus"))
    verdict = (f"sfbus (slower burst), small messages one way: {low / small[QUEUES[1]]:.1f}x "
               f"faster-fifo put/get, {low / small[QUEUES[2]]:.1f}x its put_many (goal: 2x).")
    trips = latency_table([r for r in results if not r.messages])
    text = f"{verdict}\n\n{rate_table(flows)}\n\n{trips}"
    print("\n" + text)
    if args.write_docs:
        command = "python -m bench.bus " + " ".join(argv if argv is not None else sys.argv[1:])
        write_docs(f"Command: `{command.strip()}`\n\nMachine: {machine()}\n\n"
                   f"{ABOUT % dict(repeat=repeat)}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
