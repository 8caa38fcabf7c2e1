"""How a message is kept in Redis: its canonical JSON, zstd-compressed with a shipped dictionary.

Each element of a conversation's message LIST is still one message, so an append is still an
RPUSH of the new messages only, a read an LRANGE, and every position a Lua script works with
(LLEN, the prefix-hash chain, the tally) is still a message position. An element's first byte
says its format:

- `{`: the canonical JSON itself (`shared.hashing.canonical`). Every message written before
  compression is in this form (a JSON object always starts with `{`, so it needs no marker and
  stays readable as it is), and so is a message compression would not shorten.
- `\\x01` (`FORMAT`): a zstd frame (magicless, with its content size, no checksum, no
  dictionary id) made with dictionary 1, `dictionaries/messages-1.zdict`: 96 KiB trained on
  real agent transcripts (`bench/message_dictionary.py`). Agent transcripts are JSON, code and
  tool output: the dictionary holds their common keys and phrases, so even a short message
  compresses, and no message needs any other to be read.

Prefix hashes stay hashes of the canonical JSON (computed before packing, shared/hashing.py),
so records and chains do not care how a message is stored. A shipped dictionary never changes:
a better one is a new file with the next format byte, and every earlier one stays readable
(docs/scaling.md says how to migrate). An element in a format this version does not know (a
newer prefit wrote it) raises `StoreFormatUnknown`.

Compressors and decompressors are per thread (zstandard's objects are not thread safe); the
dictionary is parsed once per process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import zstandard

from shared.errors import StoreFormatUnknown

JSON = ord("{")
FORMAT = 1  # the format byte of what this version writes: dictionary 1
LEVEL = 3  # zstd's default: level 6 saves 2 % more of the JSON at 3x the CPU (docs/benchmarks.md)
DICTIONARIES = Path(__file__).with_name("dictionaries")
_MARK = bytes([FORMAT])
_local = threading.local()


def dictionary_path(version: int) -> Path:
    """The shipped zstd dictionary of format byte `version`."""
    return DICTIONARIES / f"messages-{version}.zdict"


@cache
def _dictionary(version: int) -> zstandard.ZstdCompressionDict:
    try:
        data = dictionary_path(version).read_bytes()
    except FileNotFoundError:
        raise StoreFormatUnknown(
            f"a stored message is in format {version}, which this version of prefit cannot "
            "read (a newer one wrote it)"
        ) from None
    found = zstandard.ZstdCompressionDict(data, dict_type=zstandard.DICT_TYPE_FULLDICT)
    found.precompute_compress(level=LEVEL)
    return found


def _compressor() -> zstandard.ZstdCompressor:
    found: zstandard.ZstdCompressor | None = getattr(_local, "compressor", None)
    if found is None:
        params = zstandard.ZstdCompressionParameters.from_level(
            LEVEL,
            format=zstandard.FORMAT_ZSTD1_MAGICLESS,
            write_content_size=1,
            write_checksum=0,
            write_dict_id=0,
        )
        found = zstandard.ZstdCompressor(dict_data=_dictionary(FORMAT), compression_params=params)
        _local.compressor = found
    return found


def _decompressor(version: int) -> zstandard.ZstdDecompressor:
    table: dict[int, zstandard.ZstdDecompressor] = _local.__dict__.setdefault("decompressors", {})
    found = table.get(version)
    if found is None:
        found = table[version] = zstandard.ZstdDecompressor(
            dict_data=_dictionary(version), format=zstandard.FORMAT_ZSTD1_MAGICLESS
        )
    return found


def pack(canonical: bytes) -> bytes:
    """The stored form of a message's canonical JSON: compressed, unless that is no shorter."""
    frame = _compressor().compress(canonical)
    if len(frame) + 1 >= len(canonical):
        return canonical
    return _MARK + frame


def unpack(stored: bytes) -> bytes:
    """A message's canonical JSON from its stored form (either format)."""
    if not stored or stored[0] == JSON:
        return stored
    try:
        return _decompressor(stored[0]).decompress(stored[1:])
    except zstandard.ZstdError as exc:
        raise StoreFormatUnknown(f"a stored message does not decompress: {exc}") from None


def unpack_all(stored: Iterable[bytes]) -> list[bytes]:
    """`unpack` of each stored message, in order."""
    return [unpack(m) for m in stored]
