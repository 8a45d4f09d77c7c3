"""The wire format: round trips, and bad input never raising anything but FrameError."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sfbus.errors import FrameError
from sfbus.frames import (
    Heartbeat,
    PayloadDecoder,
    Start,
    decode_control,
    decode_data,
    encode_control,
    encode_data,
)
from sfbus.messages import Message


class Rows(Message, frozen=True):
    worker: int
    slots: tuple[int, ...]


def test_data_frame_round_trip() -> None:
    frame = encode_data(3, [(7, Rows(1, (4, 5))), (8, Rows(2, ()))])
    sender, deliveries = decode_data(frame)
    decoder = PayloadDecoder(Rows)
    assert sender == 3
    assert [(edge, decoder.decode(raw)) for edge, raw in deliveries] == [
        (7, Rows(1, (4, 5))), (8, Rows(2, ()))]


def test_payload_is_a_bare_array_of_fields() -> None:
    assert msgspec.msgpack.decode(encode_data(0, [(1, Rows(9, (1,)))])) == [0, [[1, [9, [1]]]]]


def test_wrong_payload_type_is_a_frame_error() -> None:
    _, [(_, raw)] = decode_data(msgspec.msgpack.encode([0, [[1, ["nine", []]]]]))
    with pytest.raises(FrameError, match=r"bad Rows payload: Expected `int`, got `str`"):
        PayloadDecoder(Rows).decode(raw)


def test_control_round_trip() -> None:
    beat = Heartbeat("p", 12, {"a": (0.5, "on_x")})
    assert decode_control(encode_control(beat)) == beat
    assert decode_control(encode_control(Start())) == Start()


@given(st.binary(max_size=256))
def test_random_bytes_raise_only_frame_error(data: bytes) -> None:
    for decode in (decode_data, decode_control):
        with contextlib.suppress(FrameError):
            decode(data)


@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
                    | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4), max_leaves=12))
def test_random_msgpack_raises_only_frame_error(value: object) -> None:
    data = msgspec.msgpack.encode(value)
    decoder = PayloadDecoder(Rows)
    try:
        _sender, deliveries = decode_data(data)
        for _edge, raw in deliveries:
            decoder.decode(raw)
    except FrameError:
        pass
