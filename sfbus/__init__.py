"""sfbus: an asyncio / ZeroMQ message-bus microkernel for high-throughput reinforcement learning.

The public kernel API is the names below; everything else in the package is private.
"""

from sfbus.actor import Actor, NoParams, Signal, slot
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
from sfbus.messages import Empty, Message
from sfbus.shm import ArraySpec, SharedArray
from sfbus.slot_pool import SlotPool

__all__ = [
    "Actor",
    "ActorDeadError",
    "ArraySpec",
    "BadInput",
    "Empty",
    "FrameError",
    "Message",
    "NoParams",
    "RunDirError",
    "RunFailed",
    "SfbusError",
    "SharedArray",
    "SharedMemoryError",
    "Signal",
    "SlotPool",
    "SlotPoolError",
    "SlotPoolExhausted",
    "TopologyError",
    "slot",
]
