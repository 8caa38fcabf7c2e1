"""HeuristicCounter against tiktoken on dense and ordinary text.

Its ratio to o200k_base and cl100k_base per category, before (every ASCII character at
chars_per_token) and after (hex, dense and number runs at their own density), and what
counting costs on 24 KB and 2 MB.

The dense categories are generated (seeded): SHA-256 lines, UUID lists, base64, a numbers
table, minified JSON with ids, git log, Python stack traces, compiler output, timestamped
logs. Prose is the reference text, docs/*.md and shared/**/*.py of this repository; the
real transcripts count every message text and tool-call argument of /work/shared/transcripts.

    uv run python -m bench.counting_density
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from shared.counting.counters import HeuristicCounter
from shared.counting.encodings import load_encoding
from tests.conftest import SHARED, TIKTOKEN_DIR

ROOT = Path(__file__).resolve().parent.parent


class Before(HeuristicCounter):
    """The heuristic without densities for runs: every ASCII character at chars_per_token."""

    def _runs(self, text: str) -> float:
        return 0.0


def generated(seed: int = 7) -> dict[str, str]:
    """Dense tool output of the kinds agents see, about 10-25 KB each."""
    r = random.Random(seed)

    def hx(n: int = 64) -> str:
        return "".join(r.choice("0123456789abcdef") for _ in range(n))

    def uid() -> str:
        return str(uuid.UUID(int=r.getrandbits(128)))

    blob = base64.b64encode(r.randbytes(18000)).decode()
    frames = [
        'File "/usr/lib/python3.11/site-packages/django/db/models/query.py", line {n}, in get\n'
        "    return self._fetch_all()",
        'File "/home/app/src/service/handlers.py", line {n}, in handle\n'
        "    result = await self.dispatch(request, **kwargs)",
    ]
    errors = [
        "error: use of undeclared identifier 'buffer_len'",
        "warning: unused variable 'tmp' [-Wunused-variable]",
        "note: in instantiation of function template specialization 'std::vector<int>::push_back'",
    ]
    logs = ["request completed in {n} ms for tenant acme", "cache miss, loading from the store"]
    return {
        "sha256 lines": "\n".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(375)),
        "sha256sum output": "\n".join(f"{hx()}  src/module_{i}/file_{i}.py" for i in range(400)),
        "uuid list": "\n".join(uid() for _ in range(700)),
        "base64": "\n".join(blob[i : i + 76] for i in range(0, len(blob), 76)),
        "numbers table": "\n".join(
            f"{i},{r.uniform(-1e3, 1e3):.4f},{r.randrange(10**6)},{r.random():.6f}"
            for i in range(800)
        ),
        "minified json ids": json.dumps(
            [{"id": uid(), "sha": hx(40), "n": r.randrange(10**9), "ok": True} for _ in range(150)],
            separators=(",", ":"),
        ),
        "git log": "\n\n".join(
            f"commit {hx(40)}\nAuthor: Ann Lee <dev{r.randrange(99)}@example.com>\n"
            f"Date:   Mon Nov {r.randrange(1, 28)} {r.randrange(24):02d}:{r.randrange(60):02d}:"
            f"{r.randrange(60):02d} 2026 +0000\n\n    Fix race in the scheduler"
            for _ in range(150)
        ),
        "stack traces": "\n".join(
            "Traceback (most recent call last):\n"
            + "\n".join("  " + r.choice(frames).format(n=r.randrange(2000)) for _ in range(8))
            + "\nValueError: invalid literal for int() with base 10: 'abc'"
            for _ in range(40)
        ),
        "compiler output": "\n".join(
            f"src/net/conn_{r.randrange(40)}.cpp:{r.randrange(1, 900)}:{r.randrange(1, 80)}: "
            + r.choice(errors)
            for _ in range(400)
        ),
        "timestamped log": "\n".join(
            f"2026-11-{r.randrange(1, 28):02d}T{r.randrange(24):02d}:{r.randrange(60):02d}:"
            f"{r.randrange(60):02d}Z INFO " + r.choice(logs).format(n=r.randrange(900))
            for _ in range(400)
        ),
    }


def ordinary() -> dict[str, list[str]]:
    """Prose and code of this repository and the reference, and the real transcripts."""
    docs = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    code = [p.read_text() for p in sorted((ROOT / "shared").rglob("*.py"))]
    return {
        "reference (prose)": [(SHARED / "seed" / "aaa-context-api.txt").read_text()],
        "docs/*.md": docs,
        "shared/**/*.py": code,
        "real transcripts": transcript_texts(),
    }


def transcript_texts() -> list[str]:
    texts: list[str] = []
    for path in sorted((SHARED / "transcripts").glob("*.json")):
        for m in json.loads(path.read_text())["messages"]:
            content = m.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts += [p.get("text", "") for p in content if isinstance(p, dict)]
            for call in m.get("tool_calls") or []:
                args = call["function"]["arguments"]
                texts.append(args if isinstance(args, str) else json.dumps(args))
    return texts


def timed(fn: Callable[[], object], repeat: int = 5) -> float:
    """Best of `repeat` runs, in microseconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def main() -> None:
    o200k = load_encoding("o200k_base", TIKTOKEN_DIR)
    cl100k = load_encoding("cl100k_base", TIKTOKEN_DIR)
    before, after = Before(), HeuristicCounter()
    rows = {k: [v] for k, v in generated().items()} | ordinary()
    print("| text | o200k tokens | before/o200k | after/o200k | before/cl100k | after/cl100k |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, texts in rows.items():
        exact = [sum(len(e.encode_ordinary(t)) for t in texts) for e in (o200k, cl100k)]
        old, new = (sum(c._chars((t,)) for t in texts) for c in (before, after))
        print(
            f"| {name} | {exact[0]:,} | {old / exact[0]:.2f} | {new / exact[0]:.2f} "
            f"| {old / exact[1]:.2f} | {new / exact[1]:.2f} |"
        )
    print("\n| text | size | before µs | after µs |\n| --- | ---: | ---: | ---: |")
    samples = {k: v[0] for k, v in rows.items() if len(v) == 1}
    samples["shared/**/*.py"] = "\n".join(rows["shared/**/*.py"])
    samples["real transcripts"] = "\n".join(rows["real transcripts"])
    for name in ("sha256 lines", "base64", "numbers table", "shared/**/*.py", "real transcripts"):
        for size in (24_000, 2_000_000):
            text = (samples[name] * (size // len(samples[name]) + 1))[:size]
            us = [timed(partial(c._chars, (text,))) for c in (before, after)]
            print(f"| {name} | {size:,} | {us[0]:,.1f} | {us[1]:,.1f} |")


if __name__ == "__main__":
    main()
