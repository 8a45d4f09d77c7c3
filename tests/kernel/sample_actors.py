"""Small actors the topology and graph tests wire together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sfbus.actor import Actor, Signal, slot
from sfbus.messages import Empty, Message


class Item(Message, frozen=True):
    """One produced value."""

    value: int


class Producer(Actor):
    """Emits ``count`` items."""

    @dataclass(frozen=True)
    class Params:
        count: int = 10
        """How many items to produce."""
        rate: float = 1.0
        """Items per second."""

    item_ready = Signal(Item)
    finished = Signal(Empty)


@dataclass(frozen=True)
class Network:
    """A nested parameter record."""

    hidden: int = 64
    activation: Literal["relu", "tanh"] = "relu"


class Consumer(Actor):
    """Receives items; ``total`` has no default, so it must come from params or settings."""

    @dataclass(frozen=True)
    class Params:
        total: int
        """How many items to expect."""
        sampling: Literal["plain", "batched"] = "plain"
        lr: float = 1e-4
        tag: str | None = None
        layers: tuple[int, ...] = (32, 32)
        names: list[str] = field(default_factory=list)
        weights: dict[str, float] = field(default_factory=dict)
        network: Network = Network()

    done = Signal(Empty)

    @slot
    def on_item_ready(self, msg: Item) -> None:
        """Count one item."""

    @slot
    def on_finished(self, msg: Empty) -> None:
        """The producer is done."""


class Checked(Actor):
    """Its Params validate themselves after parsing."""

    @dataclass(frozen=True)
    class Params:
        low: int = 0
        high: int = 1

        def __post_init__(self) -> None:
            if self.low > self.high:
                raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")


class BadSlot(Actor):
    """A slot whose parameter has no Message annotation: a bug in the class, found at load."""

    @slot
    def on_anything(self, msg) -> None:  # no annotation, on purpose
        """Accepts nothing the checker understands."""


class NotAnActor:
    """A class that does not subclass Actor."""
