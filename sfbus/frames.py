"""The wire format: the one encode/decode pair for data frames and control messages.

A **data frame** is one ZeroMQ message holding one msgpack array::

    [sender: int, [[edge: int, payload: array], ...]]

``sender`` is the wire id of the sending process (its index in the routing table); each delivery
names an edge id (which fixes the target actor, slot and payload type) and carries the payload
struct as a bare msgpack array of its fields. A sender coalesces the deliveries it emits within
one loop iteration (up to ``MAX_DELIVERIES_PER_FRAME``) into one frame, which is what lets the bus
move small messages faster than a queue that pays a syscall per message.

A **control message** travels between a process and the supervisor, as a msgpack array whose
first element is the message kind (a msgspec tagged union). Nothing on the bus is ever pickled.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from sfbus.errors import FrameError
from sfbus.messages import Message

MAX_DELIVERIES_PER_FRAME = 4096
SUPERVISOR_SENDER = -1
CONTROL_EDGE = -1

Delivery = tuple[int, msgspec.Raw]
# msgspec raises UnicodeDecodeError for a string that is not UTF-8 (found by the fuzz test).
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)

_data_encoder = msgspec.msgpack.Encoder()
_data_decoder = msgspec.msgpack.Decoder(tuple[int, list[tuple[int, msgspec.Raw]]])


def encode_data(sender: int, deliveries: Sequence[tuple[int, Message]]) -> bytes:
    """Encode one data frame."""
    return _data_encoder.encode((sender, deliveries))


def decode_data(frame: bytes) -> tuple[int, list[Delivery]]:
    """Decode a data frame's envelope; payloads stay raw until their edge's type is known.

    Raises FrameError (the peer's fault) for anything that is not a well-formed envelope.
    """
    try:
        return _data_decoder.decode(frame)
    except _DECODE_ERRORS as error:
        raise FrameError(f"malformed data frame ({len(frame)} bytes): {error}") from None


class PayloadDecoder:
    """Decodes the raw payload of one edge into its typed, validated struct."""

    __slots__ = ("_decoder", "payload")

    def __init__(self, payload: type[Message]) -> None:
        self.payload = payload
        self._decoder = msgspec.msgpack.Decoder(payload)

    def decode(self, raw: msgspec.Raw) -> Message:
        """Decode and validate; raises FrameError when the bytes do not match the type."""
        try:
            return self._decoder.decode(raw)
        except _DECODE_ERRORS as error:
            raise FrameError(f"bad {self.payload.__name__} payload: {error}") from None


# ----- control messages ----------------------------------------------------------------------


class Control(msgspec.Struct, frozen=True, array_like=True, tag=True):
    """Base of the supervisor's control messages."""


class Ready(Control, frozen=True):
    """A process built its actors and bound its socket."""

    process: str
    pid: int


class Started(Control, frozen=True):
    """Every actor of a process ran ``on_start``."""

    process: str


class Heartbeat(Control, frozen=True):
    """A process is alive; carries its progress, each actor's last activity (seconds ago, what)
    and each actor's counts of the kinds of progress it reports (``Actor.report_advance``)."""

    process: str
    progress: int
    activity: dict[str, tuple[float, str]]
    advances: dict[str, dict[str, int]] = {}


class ActorFailed(Control, frozen=True):
    """An actor's slot, timer or task raised (the actor goes on)."""

    process: str
    actor: str
    where: str
    error: str


class StopRequested(Control, frozen=True):
    """An actor asked to end the run."""

    process: str
    actor: str
    reason: str


class Start(Control, frozen=True):
    """Supervisor to process: run every actor's ``on_start``."""


class Stop(Control, frozen=True):
    """Supervisor to process: stop gracefully and exit."""


ControlMessage = Ready | Started | Heartbeat | ActorFailed | StopRequested | Start | Stop

_control_encoder = msgspec.msgpack.Encoder()
_control_decoder = msgspec.msgpack.Decoder(ControlMessage)


def encode_control(message: Control) -> bytes:
    """Encode a control message."""
    return _control_encoder.encode(message)


def decode_control(frame: bytes) -> Control:
    """Decode a control message; raises FrameError on anything else."""
    try:
        return _control_decoder.decode(frame)
    except _DECODE_ERRORS as error:
        raise FrameError(f"malformed control frame ({len(frame)} bytes): {error}") from None
