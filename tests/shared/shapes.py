"""Conversation shapes from public agent and chat datasets that the real transcripts lack.

Built deterministically (seeded), small enough to run at many windows: an OpenHands /
SWE-agent session (parallel calls answered out of order, results as text parts, huge
outputs), a Claude-Code session (a huge system prompt, pasted files, a result larger than
any window, a follow-up request), a ShareGPT chat (no tools, a pasted message larger than
the window, the task restated), a tau-bench customer-service dialogue (greeting first,
developer and mid-conversation system messages, names, screenshots, empty and null
contents, CJK and emoji), and one- and two-message conversations larger than the window.
"""

from __future__ import annotations

import json
import random
from typing import Any

from shared.messages import Message
from tests.builders import calling, result, tool_call

WORDS = ("error", "src/app.py", "def", "return", "PASS", "FAIL", "0x1f", "import", "self", "|")
SCREENSHOT = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "iVBOR" * 20000}}


def text(n: int, seed: int) -> str:
    """About `n` characters of log-like text."""
    r = random.Random(seed)
    out = " ".join(r.choice(WORDS) for _ in range(n // 5 + 1))
    return out[:n]


def openhands(steps: int = 60, size: int = 3000) -> list[Message]:
    msgs: list[Message] = [
        {"role": "system", "content": "You are OpenHands. " + text(3000, 1)},
        {"role": "user", "content": "Fix the failing test in repo X. " + text(600, 2)},
    ]
    for i in range(steps):
        if i % 7 == 3:  # three calls at once, answered in another order
            ids = [f"toolu_{i}_{k}" for k in range(3)]
            msgs.append(
                calling(*(tool_call(c, "bash", {"cmd": f"grep {k}"}) for k, c in enumerate(ids)))
            )
            msgs += [result(c, text(size // 3, i + k)) for k, c in enumerate(reversed(ids))]
            continue
        out = text(size * 10 if i % 5 == 0 else size, i)
        content: Any = [{"type": "text", "text": out[:99]}, {"type": "text", "text": out[99:]}]
        msgs.append(calling(tool_call(f"call_{i}", "bash", {"cmd": f"cat f{i}.py"}), content=""))
        msgs.append(result(f"call_{i}", content if i % 4 == 1 else out))
    return msgs


def claude_code(huge: int = 400_000) -> list[Message]:
    msgs: list[Message] = [
        {"role": "system", "content": "You are Claude Code. " + text(40_000, 3)},
        {"role": "user", "content": "Refactor this:\n```\n" + text(12_000, 4) + "\n```"},
    ]
    for i in range(30):
        if i == 15:
            msgs.append({"role": "user", "content": "Also keep the public API unchanged."})
        msgs.append(
            calling(tool_call(f"toolu_{i:03d}", "Read", {"file_path": f"/a/{i}.py"}), content="ok")
        )
        msgs.append(result(f"toolu_{i:03d}", text(huge if i == 10 else 4000, i)))
    msgs.append(calling(tool_call("toolu_last", "Bash", {"command": "pytest"})))
    msgs.append(result("toolu_last", text(huge, 99)))  # agents prepare right after a result
    return msgs


def sharegpt(turns: int = 30, pasted: int = 300_000) -> list[Message]:
    msgs: list[Message] = [
        {"role": "user", "content": "Write a story about dragons. " + text(1500, 5)}
    ]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": text(3000, 100 + i)})
        says = text(pasted, 7) if i == turns // 2 else "continue " + text(1000, 200 + i)
        msgs.append({"role": "user", "content": says})
    msgs.append({"role": "assistant", "content": "Done."})
    msgs.append({"role": "user", "content": "To restate: five chapters, dragons, happy ending."})
    return msgs


def tau(turns: int = 20) -> list[Message]:
    msgs: list[Message] = [
        {"role": "system", "content": "You are an airline agent. Policy: " + text(4000, 11)},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "予約を変更したい 🛫 change my flight", "name": "customer"},
        {"role": "developer", "content": "Be polite."},
    ]
    for i in range(turns):
        shot = [{"type": "text", "text": f"screenshot {i} 😀 中文 ü"}, SCREENSHOT]
        msgs.append({"role": "user", "name": "customer", "content": shot})
        msgs.append(calling(tool_call(f"c{i}", "get_reservation", {"id": i})))
        msgs.append(result(f"c{i}", "" if i % 5 == 0 else json.dumps({"r": text(2000, i)})))
        if i % 10 == 5:
            msgs.append({"role": "system", "content": "Reminder: verify identity. 🔥"})
        msgs.append({"role": "assistant", "content": "" if i % 4 == 0 else "好的 " + text(400, i)})
    return msgs


def pending(msgs: list[Message]) -> list[Message]:
    """`msgs` with a last call still in flight."""
    return [*msgs, calling(tool_call("inflight", "bash", {"cmd": "make"}))]


def too_big(chars: int = 700_000) -> list[list[Message]]:
    """One- and two-message conversations larger than any window here."""
    return [
        [{"role": "user", "content": text(chars, 1)}],
        [{"role": "system", "content": text(chars, 2)}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": text(chars, 3)}],
    ]


def all_shapes() -> dict[str, list[Message]]:
    shapes = {
        "openhands": openhands(),
        "openhands_pending": pending(openhands(30)),
        "claude_code": claude_code(),
        "sharegpt": sharegpt(),
        "tau": tau(),
        "tau_pending": pending(tau(8)),
    }
    shapes |= {f"too_big_{k}": m for k, m in enumerate(too_big())}
    return shapes
