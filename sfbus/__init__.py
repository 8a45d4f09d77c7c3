"""sfbus: an asyncio / ZeroMQ message-bus microkernel for high-throughput reinforcement learning.

The public kernel API is the names below; everything else in the package is private.

- Writing actors: ``Actor``, ``Signal``, ``slot``, ``NoParams``, ``Message``, ``Empty``;
  ``ActorContext`` (what a running actor sees: its run, routing table and shared memory);
  ``Range`` (bounds of a number parameter, as ``Annotated`` metadata), ``Interval`` (a
  timer's seconds, 0.01 to 1e7) and ``Seconds`` (a duration, 0 to 1e7).
- Shared memory: ``ArraySpec``, ``SharedArray``, ``SlotPool``.
- Topologies: ``Topology``, ``load_topology`` (a file plus ``--set`` overrides, validated),
  ``validate_topology`` (that, plus the sizes of the run's shared arrays, as ``sfbus validate``),
  ``import_actor_class`` (a ``module:Class`` path), ``import_object`` (any ``module:name``
  path a setting holds; ``ImportPathError`` says what is missing), ``instance_name`` (the name of
  an actor's replica).
- Runs: ``run`` (``sfbus run`` from Python: a topology file and ``--set`` overrides, run to its
  end in processes that import what the caller can), ``RunLimits`` (``--max-frames`` /
  ``--max-seconds`` as actors see them), ``STOP_WITH_PARENT_ENV`` (set it to your pid in the
  environment of an ``sfbus run`` you start, and the run stops when you die),
  ``new_run_dir`` and ``make_private_dir`` (run folders only this user can read).
- Run records: ``RunRecord`` (a run-wide fact, computed once at launch from the topology: list
  its type in an actor class's ``records``, read it as ``context.records[Type]`` in any process,
  or in ``shared_arrays``), ``RunRecords`` (the run's records by type).
- Helpers: ``RateLimitedLog`` (a warning on a hot path, at most once per interval),
  ``command_lines`` (every process's argv, for sweeping up after external engines),
  ``keep_freed_memory`` (glibc's malloc keeps big freed blocks: every process of a run sets it
  as it starts; a component allocating big tensors in a process of its own making calls it).
- Errors: ``SfbusError`` and its kinds; ``BadInput`` is the user's (exit 2).
"""

from sfbus.actor import Actor, NoParams, Signal, slot
from sfbus.context import ActorContext
from sfbus.errors import (
    ActorDeadError,
    BadInput,
    FrameError,
    RunDirError,
    RunFailed,
    SfbusError,
    SharedMemoryError,
    SlotPoolError,
    SlotPoolExhausted,
    TopologyError,
)
from sfbus.heap import keep_freed_memory
from sfbus.launch import STOP_WITH_PARENT_ENV, run
from sfbus.messages import Empty, Message
from sfbus.procfs import command_lines
from sfbus.ratelimit import RateLimitedLog
from sfbus.records import RunRecord, RunRecords
from sfbus.routing import instance_name
from sfbus.rundir import RunLimits, make_private_dir, new_run_dir
from sfbus.shm import ArraySpec, SharedArray
from sfbus.slot_pool import SlotPool
from sfbus.topology import Topology, import_actor_class, load_topology
from sfbus.topology.imports import ImportPathError, import_object
from sfbus.topology.params import Interval, Range, Seconds
from sfbus.validation import validate_topology

__all__ = [
    "STOP_WITH_PARENT_ENV",
    "Actor",
    "ActorContext",
    "ActorDeadError",
    "ArraySpec",
    "BadInput",
    "Empty",
    "FrameError",
    "ImportPathError",
    "Interval",
    "Message",
    "NoParams",
    "Range",
    "RateLimitedLog",
    "RunDirError",
    "RunFailed",
    "RunLimits",
    "RunRecord",
    "RunRecords",
    "Seconds",
    "SfbusError",
    "SharedArray",
    "SharedMemoryError",
    "Signal",
    "SlotPool",
    "SlotPoolError",
    "SlotPoolExhausted",
    "Topology",
    "TopologyError",
    "command_lines",
    "import_actor_class",
    "import_object",
    "instance_name",
    "keep_freed_memory",
    "load_topology",
    "make_private_dir",
    "new_run_dir",
    "run",
    "slot",
    "validate_topology",
]
