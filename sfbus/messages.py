"""Payload records carried by signals: small, frozen, typed structs of scalars."""

from __future__ import annotations

import msgspec


class Message(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """Base of every signal payload.

    Subclass it with typed fields (ints, floats, bools, short strings, tuples of those); never
    tensors. ``array_like`` keeps the wire form a bare msgpack array of the field values.
    """


class Empty(Message, frozen=True):
    """The payload of a signal that carries nothing but the fact it happened."""
