"""Redis memory of stored conversations: real agent transcripts appended turn by turn via the API.

    uv run python -m bench.store_memory [--all] [--server-root DIR]

Starts its own redis-server and the API (`prefit up`'s uvicorn, bench/harness.py), appends each
transcript as a client would (the head, then one turn group per `POST .../messages` with
`expected_length`), then sums `MEMORY USAGE key SAMPLES 0` (every element counted, not a
sample) over every key of the tenant, and over its message lists alone, against the bytes of
the transcripts' canonical JSON. `used_memory` before and after is printed too (it includes
allocator overhead, and moves with anything else the server holds).

Transcripts: the coding-agent runs of the repository's `transcripts/` (held out from the
training of the message dictionary, bench/message_dictionary.py); `--all` adds every agent
transcript of `../shared/transcripts` (most of which the dictionary was trained on).
`--server-root` runs the API of another checkout (an older commit's tree: before and after).
Prints markdown; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import httpx
import redis

from bench.harness import MODEL, ROOT, TENANT, TRANSCRIPTS, server_options, start_api, stop
from shared.commands.redisproc import RedisProcess
from shared.hashing import canonical
from shared.head import head_end
from shared.messages import Message, groups
from shared.store import keys

AGENTS = ("mswea", "sweagent")


def transcripts(everything: bool) -> list[Path]:
    """The agent transcripts measured (see the module)."""
    folders = [ROOT / "transcripts", *([TRANSCRIPTS] if everything else [])]
    found = {p.name: p for d in folders for p in sorted(d.glob("*.json"))}
    return [p for name, p in sorted(found.items()) if name.startswith(AGENTS)]


def turns(messages: list[Message]) -> list[list[Message]]:
    """The head, then each turn group: what a client appends, one request each."""
    head = head_end(messages)
    out = [messages[:head]] if head else []
    return out + [messages[a:b] for a, b in groups(messages, head)]


def append_all(url: str, conv_id: str, messages: list[Message]) -> int:
    """Append `messages` turn by turn; the number of requests."""
    length = 0
    chunks = turns(messages)
    with httpx.Client(base_url=url, timeout=60) as client:
        for chunk in chunks:
            body = {"messages": chunk, "model": MODEL, "expected_length": length}
            r = client.post(f"/v1/conversations/{conv_id}/messages", json=body)
            if r.status_code != 200:
                raise SystemExit(f"{conv_id}: append refused: {r.status_code} {r.text[:300]}")
            length = r.json()["length"]
    return len(chunks)


def memory(client: redis.Redis) -> tuple[int, int, int]:
    """MEMORY USAGE of every key of the tenant, of its message lists, and the key count."""
    total = lists = count = 0
    for key in client.scan_iter(match=keys.tenant_pattern(TENANT), count=1000):
        used = int(client.memory_usage(key, samples=0) or 0)
        total += used
        count += 1
        if key.endswith(b":msgs"):
            lists += used
    return total, lists, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="every agent transcript of ../shared")
    server_options(ap)
    args = ap.parse_args()
    paths = transcripts(args.all)
    with RedisProcess() as server, tempfile.TemporaryDirectory() as tmp:
        client = redis.Redis.from_url(server.url)
        before = int(client.info("memory")["used_memory"])
        proc, url = start_api(server.url, Path(tmp) / "api.log", root=args.server_root)
        raw = messages = requests = 0
        try:
            for i, path in enumerate(paths):
                transcript = json.loads(path.read_text())["messages"]
                requests += append_all(url, f"mem-{i}", transcript)
                messages += len(transcript)
                raw += sum(len(canonical(m)) for m in transcript)
        finally:
            stop(proc)
        total, lists, count = memory(client)
        after = int(client.info("memory")["used_memory"])
        client.close()
    root = "this checkout" if args.server_root == ROOT else str(args.server_root)
    print(f"\nAPI from {root}: {len(paths)} agent transcripts, {messages:,} messages, "
          f"{requests:,} appends, {raw:,} bytes of canonical JSON; {count} keys.\n")  # fmt: skip
    print("| what | bytes | x the JSON |")
    print("| --- | ---: | ---: |")
    for name, value in (
        ("MEMORY USAGE, every key", total),
        ("MEMORY USAGE, message lists", lists),
        ("MEMORY USAGE, the rest", total - lists),
        ("used_memory, after - before", after - before),
    ):
        print(f"| {name} | {value:,} | {value / raw:.3f}x |")


if __name__ == "__main__":
    main()
