"""`gguf.GGUFReader`, made to open a file in well under a second: metadata arrays are not taken apart element by
element.

The reader builds one numpy view per element of every metadata array: SmolLM2's 49k-token vocabulary and its 49k
merges cost ten seconds, while qkinspect needs a dozen scalars, the tensor infos and, at most, the vocabulary's
length. `LazyArrayReader` keeps the reader's own parsing of everything else (header, scalars, strings, tensor infos,
alignment, its checks) and changes one step: an array of numbers becomes one view of all its elements, and an array
of strings is stepped over (each length checked against the file) and kept as its length only.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType


class LazyArrayReader(GGUFReader):
    """A GGUFReader whose metadata arrays are cheap: numbers as one view, strings skipped.

    ``field.contents()`` gives a number array's values as the reader does; a string array's field has no data
    (``contents()`` is ``[]``): ask `array_length` for its length.
    """

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        offs, n = orig_offs + 12, int(alen[0])
        itype = GGUFValueType(raw_itype[0])
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is not None:  # numbers: one view of n elements, read as the reader reads one
            values = self._get(offs, nptype, n)
            if len(values) != n:
                raise ValueError(f"metadata array of {n} elements runs past the end of the file")
            return 12 + int(values.nbytes), [raw_itype, alen, values], [2], [GGUFValueType.ARRAY, itype]
        if itype != GGUFValueType.STRING:
            raise ValueError(f"unhandled metadata array of {itype.name}")
        return 12 + self._skip_strings(offs, n) - offs, [raw_itype, alen], [], [GGUFValueType.ARRAY, itype]

    def _skip_strings(self, offs: int, n: int) -> int:
        """The offset after `n` length-prefixed strings starting at `offs`."""
        order = "<" if (sys.byteorder == "little") == (self.byte_order == "I") else ">"
        buf, size, length = memoryview(self.data), len(self.data), struct.Struct(order + "Q")
        for _ in range(n):
            offs += 8 + length.unpack_from(buf, offs)[0]
            if offs > size:
                raise ValueError("metadata string array runs past the end of the file")
        return offs


def string_array(reader: Any, field: Any, limit: int) -> list[str]:
    """The strings of a metadata string array (which `LazyArrayReader` stepped over), read from the file: at most
    `limit` of them (ValueError beyond), each UTF-8 (undecodable bytes replaced)."""
    if list(field.types) != [GGUFValueType.ARRAY, GGUFValueType.STRING]:
        raise ValueError(f"not an array of strings ({'/'.join(t.name for t in field.types)})")
    n = array_length(field)
    if n > limit:
        raise ValueError(f"{n:,} strings, more than {limit:,}")
    order = "<" if (sys.byteorder == "little") == (reader.byte_order == "I") else ">"
    buf, size, length = memoryview(reader.data), len(reader.data), struct.Struct(order + "Q")
    offs = int(field.offset) + 8 + int(field.parts[0][0]) + 4 + 4 + 8  # key length, key, type, item type, count
    out = []
    for _ in range(n):
        k = length.unpack_from(buf, offs)[0]
        if offs + 8 + k > size:
            raise ValueError("metadata string array runs past the end of the file")
        out.append(bytes(buf[offs + 8:offs + 8 + k]).decode("utf-8", errors="replace"))
        offs += 8 + k
    return out


def array_length(field: Any) -> int:
    """The number of elements of a metadata array field (read by either reader)."""
    return int(field.parts[4][0])  # parts: key length, key, value type, item type, element count, ...


__all__ = ["LazyArrayReader", "array_length", "string_array"]
