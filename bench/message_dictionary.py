"""Train the zstd dictionary messages are stored with, and measure it on transcripts it never saw.

    uv run python -m bench.message_dictionary [--version 1] [--size 98304] [--write]

Samples: the canonical JSON of every message of `../shared/transcripts` except the files also
in the repository's `transcripts/` folder, which are held out: the ratios below are measured on
them (the agent ones: the coding-agent runs). Training is deterministic for the same samples
and parameters (`--k`, `--d`, found once by zstd's optimizer), so `--write` reproduces the
shipped `shared/store/dictionaries/messages-<version>.zdict` byte for byte; a dictionary that
shipped is never rewritten, a new one takes the next version (shared/store/compression.py).
Prints markdown; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import zstandard

from bench.harness import ROOT, TRANSCRIPTS
from shared.hashing import canonical
from shared.store.compression import LEVEL, dictionary_path

HELD_OUT = ROOT / "transcripts"
AGENTS = ("mswea", "sweagent")


def messages(paths: list[Path]) -> list[bytes]:
    """The canonical JSON of every message of the transcripts at `paths`."""
    return [canonical(m) for p in paths for m in json.loads(p.read_text())["messages"]]


def packed_size(d: zstandard.ZstdCompressionDict | None, sample: list[bytes]) -> int:
    """Bytes of `sample` stored as shared/store/compression.py stores them with `d`."""
    params = zstandard.ZstdCompressionParameters.from_level(
        LEVEL,
        format=zstandard.FORMAT_ZSTD1_MAGICLESS,
        write_content_size=1,
        write_checksum=0,
        write_dict_id=0,
    )
    c = zstandard.ZstdCompressor(dict_data=d, compression_params=params)
    return sum(min(len(c.compress(m)) + 1, len(m)) for m in sample)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--size", type=int, default=98304, help="dictionary bytes")
    ap.add_argument("--k", type=int, default=1490, help="COVER segment size (0: optimize)")
    ap.add_argument("--d", type=int, default=8, help="COVER dmer size (0: optimize)")
    ap.add_argument("--write", action="store_true", help="write the dictionary file")
    args = ap.parse_args()
    held = {p.name for p in HELD_OUT.glob("*.json")}
    train = messages([p for p in sorted(TRANSCRIPTS.glob("*.json")) if p.name not in held])
    started = time.perf_counter()
    trained = zstandard.train_dictionary(
        args.size, train, k=args.k, d=args.d, threads=1, dict_id=args.version
    )
    took = time.perf_counter() - started
    target = dictionary_path(args.version)
    if args.write:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(trained.as_bytes())
    shipped = target.read_bytes() if target.exists() else b""
    print(f"trained on {len(train)} messages ({sum(map(len, train)):,} bytes) in {took:.1f} s "
          f"(k={trained.k}, d={trained.d}); the shipped {target.name} is "
          f"{'the same' if shipped == trained.as_bytes() else 'different'}")  # fmt: skip
    print("\n| held out | messages | JSON bytes | no dictionary | this dictionary |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, keep in (("agent transcripts", AGENTS), ("all", ("",))):
        sample = messages([p for p in sorted(HELD_OUT.glob("*.json")) if p.name.startswith(keep)])
        raw = sum(map(len, sample))
        plain, with_dict = packed_size(None, sample), packed_size(trained, sample)
        print(f"| {name} | {len(sample)} | {raw:,} | {plain / raw:.3f}x | {with_dict / raw:.3f}x |")


if __name__ == "__main__":
    main()
