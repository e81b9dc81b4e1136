"""Bounds on a pickle before and after it is unpickled: what a memory snapshot from a stranger can cost.

Before: one pass over the opcodes (arguments are skipped by their length, not decoded) refuses
- a memo index that no pickler writes: ``LONG_BINPUT 0xffffffff`` is 6 bytes and makes the C unpickler allocate
  and clear a memo table of 4 billion slots (tens of GB); a real pickler numbers its memo entries 0, 1, 2 ...;
- a frame, string or bytes length beyond the end of the file, an unknown opcode, a pickle without its STOP.
(Globals, REDUCE and persistent ids are refused by ``snapshot.SafeUnpickler``, which names what was imported.)
After: the data is weighed with every shared reference expanded (``MAX_VALUES``), its depth bounded and its integers
kept to 64 bits: a 6 KB pickle whose lists hold the same list many times loads fast and would make every walker run
for hours; a 10,000-digit "size" would end the report in an overflow.
"""
from __future__ import annotations

import pickletools
from typing import Any

from oomdoctor.bounds import Exceeded, expanded_weight
from oomdoctor.errors import BadInput

MAX_BYTES = 2 << 30           # a snapshot with a long allocation history is hundreds of MB
MAX_VALUES = 50_000_000       # values once shared references are expanded
MAX_DEPTH = 64
MAX_INT = 1 << 64
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}

# opcode byte → (name, how its argument is laid out): n >= 0 fixed bytes; -1 up to a newline; -2/-3/-4/-5 a
# length prefix of 1/4/4/8 bytes (pickletools' UP_TO_NEWLINE, TAKEN_FROM_ARGUMENT1/4/4U/8U)
_TABLE: dict[int, tuple[str, int]] = {}
for _op in pickletools.opcodes:
    _TABLE[ord(_op.code)] = (_op.name, _op.arg.n if _op.arg is not None else 0)
_PREFIX = {-2: 1, -3: 4, -4: 4, -5: 8}


def _memo_index(name: str, arg: bytes) -> int:
    if name == "PUT":
        return int(arg.strip() or b"0") if arg.strip().isdigit() else -1
    return int.from_bytes(arg, "little")


def scan_opcodes(raw: bytes, where: str) -> None:
    """Raise BadInput when ``raw`` holds an opcode or a memo index that no memory snapshot holds."""
    i, n, memo = 0, len(raw), 0
    while i < n:
        code = raw[i]
        spec = _TABLE.get(code)
        if spec is None:
            raise BadInput(f"{where}: not a readable pickle (unknown opcode 0x{code:02x} at byte {i})")
        name, kind = spec
        i += 1
        if kind >= 0:
            arg, i = raw[i:i + kind], i + kind
        elif kind == -1:
            end = raw.find(b"\n", i)
            if end < 0:
                raise BadInput(f"{where}: not a readable pickle (a {name} argument without its newline)")
            arg, i = raw[i:end], end + 1
        else:
            size = int.from_bytes(raw[i:i + _PREFIX[kind]], "little")
            i += _PREFIX[kind]
            if i + size > n and name != "FRAME":
                raise BadInput(f"{where}: not a readable pickle ({name} of {size:,} bytes past the end of the file)")
            arg = b""
            if name != "FRAME":           # a frame's body is the opcodes that follow: scanned as such
                i += size
            elif i + size > n:
                raise BadInput(f"{where}: not a readable pickle (a frame of {size:,} bytes past the end of the file)")
        if name in _PUTS:
            idx = _memo_index(name, arg)
            if idx < 0 or idx > memo:
                raise BadInput(f"{where}: refused: memo slot {idx:,} after {memo:,} entries (a memo bomb; no "
                               "pickler writes it)")
            memo = max(memo, idx + 1)
        elif name == "MEMOIZE":
            memo += 1
        elif name == "STOP":
            return
    raise BadInput(f"{where}: not a readable pickle (it ends without its STOP opcode)")


def check_data(data: Any, where: str) -> None:
    """Raise BadInput when the unpickled ``data`` is deeper or (expanded) larger than a snapshot can be."""
    try:
        expanded_weight(data, MAX_DEPTH, MAX_VALUES, MAX_INT)
    except Exceeded as e:
        if e.kind == "int":
            raise BadInput(f"{where}: the pickle holds an integer of {e.obj.bit_length():,} bits; a memory snapshot's "
                           "sizes and addresses fit in 64")
        if e.kind == "depth":
            raise BadInput(f"{where}: the pickle nests deeper than {MAX_DEPTH} levels; not a memory snapshot")
        raise BadInput(f"{where}: the pickle expands to more than {MAX_VALUES:,} values (shared references "
                       "repeated over and over); not a memory snapshot")
