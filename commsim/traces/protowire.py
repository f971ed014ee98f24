"""The protobuf wire format, the part Chakra's .et files use, written by hand: varints,
zigzag, fixed 32/64-bit, length-delimited fields and packed repeated scalars
(developers.google.com/protocol-buffers/docs/encoding). A message decodes to its fields
by number, each a list of (wire type, value); unknown fields are kept and ignored by the
reader above, as protobuf's own parsers do. Malformed or cut-short data raises WireError.
"""

from __future__ import annotations

import struct

VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5
MASK64 = (1 << 64) - 1


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def varint(n: int) -> bytes:
    """Base-128 varint of an unsigned (or two's-complement 64-bit) integer."""
    n &= MASK64
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it)."""
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("cut short inside a varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result & MASK64, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def signed64(n: int) -> int:
    """An int64 read back from its two's-complement varint."""
    return n - (1 << 64) if n >= 1 << 63 else n


def zigzag(n: int) -> int:
    return ((n << 1) ^ (n >> 63)) & MASK64


def unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def field_varint(number: int, value: int) -> bytes:
    return key(number, VARINT) + varint(value)


def field_bytes(number: int, data: bytes | str) -> bytes:
    data = data.encode() if isinstance(data, str) else data
    return key(number, BYTES) + varint(len(data)) + data


def field_double(number: int, value: float) -> bytes:
    return key(number, FIXED64) + struct.pack("<d", value)


def packed(number: int, values) -> bytes:
    """A repeated varint field, packed (proto3's default)."""
    values = list(values)
    return field_bytes(number, b"".join(varint(v) for v in values)) if values else b""


def fields(buf: bytes) -> dict[int, list[tuple[int, int | bytes]]]:
    """Every field of one message: number -> [(wire type, int or bytes)]."""
    out: dict[int, list[tuple[int, int | bytes]]] = {}
    pos = 0
    while pos < len(buf):
        tag, pos = read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == VARINT:
            value, pos = read_varint(buf, pos)
        elif wire == FIXED64:
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == FIXED32:
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        elif wire == BYTES:
            size, pos = read_varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise WireError(f"wire type {wire} (groups are not used by this schema)")
        if pos > len(buf):
            raise WireError(f"field {number} cut short")
        out.setdefault(number, []).append((wire, value))
    return out


def repeated_varints(entries: list[tuple[int, int | bytes]]) -> list[int]:
    """A repeated varint field's values, packed or not (parsers must accept both)."""
    values: list[int] = []
    for wire, v in entries:
        if wire == VARINT:
            values.append(int(v))  # type: ignore[arg-type]
        elif wire == BYTES:
            pos, data = 0, bytes(v)  # type: ignore[arg-type]
            while pos < len(data):
                n, pos = read_varint(data, pos)
                values.append(n)
        else:
            raise WireError(f"wire type {wire} for a repeated integer")
    return values


def delimited(messages: list[bytes]) -> bytes:
    """Messages one after another, each preceded by its length as a varint (protobuf's
    writeDelimitedTo, how Chakra stores a trace)."""
    return b"".join(varint(len(m)) + m for m in messages)


def split_delimited(data: bytes) -> list[bytes]:
    """The messages of a length-delimited stream; one cut short raises WireError."""
    out, pos = [], 0
    while pos < len(data):
        size, pos = read_varint(data, pos)
        if pos + size > len(data):
            raise WireError(f"message {len(out) + 1} needs {size} bytes, {len(data) - pos} left")
        out.append(data[pos : pos + size])
        pos += size
    return out
