"""Agent-like traffic over real HTTP for fault tests and drills: conversations appended turn by
turn by a few clients, each append followed by a prepare and, now and then, a GET.

A client resends an append that got 503 (its outcome is unknown) with the same
`expected_length`; a 409 whose `actual` already counts the turn means the earlier try landed.
Every answer is recorded, so a test can assert that nothing was a 500 and that the stored
conversations hold every turn once, in order.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

WORDS = ("the", "build", "failed", "because", "the", "cache", "key", "changed", "after", "the")


def turn(conv: str, i: int) -> list[dict[str, Any]]:
    """Turn `i` of conversation `conv`: a user message and the assistant's answer."""
    text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(40))
    return [
        {"role": "user", "content": f"{conv} turn {i}: {text}"},
        {"role": "assistant", "content": f"answer {i}: {text} {text}"},
    ]


@dataclass
class Answer:
    """One request's outcome."""

    at: float  # time.monotonic() when the answer came
    kind: str  # append, prepare, get
    status: int  # 0: no answer (a transport error)
    error: str = ""
    seconds: float = 0.0  # how long the answer took


@dataclass
class Traffic:
    """Clients appending to their conversations until `stop` is set."""

    url: str
    headers: dict[str, str]
    model: str
    conversations: list[str]
    clients: int = 4
    pause_s: float = 0.02
    answers: list[Answer] = field(default_factory=list)
    acknowledged: dict[str, int] = field(default_factory=dict)  # turns answered 200
    landed: dict[str, int] = field(default_factory=dict)  # turns stored (200 or found later)
    confirmed: int = 0  # 409s whose length shows that an earlier, unanswered try landed
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)
    on_answer: Callable[[Answer], None] | None = None

    def start(self) -> Traffic:
        for c in range(self.clients):
            mine = self.conversations[c :: self.clients]
            t = threading.Thread(target=self._run, args=(mine,), daemon=True, name=f"client-{c}")
            t.start()
            self._threads.append(t)
        return self

    def finish(self, timeout: float = 30.0) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout)

    def count(self, since: float = 0.0) -> Counter[int]:
        """Answers by status, from `since` (monotonic) on."""
        with self._lock:
            return Counter(a.status for a in self.answers if a.at >= since)

    def _record(
        self, kind: str, r: httpx.Response | None, started: float, error: str = ""
    ) -> Answer:
        status = r.status_code if r is not None else 0
        if r is not None and status >= 400:
            error = r.json().get("error", {}).get("type", "") if _is_json(r) else r.text[:80]
        now = time.monotonic()
        answer = Answer(now, kind, status, error, now - started)
        with self._lock:
            self.answers.append(answer)
        if self.on_answer is not None:
            self.on_answer(answer)
        return answer

    def _run(self, mine: list[str]) -> None:
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=10.0) as client:
            turns = dict.fromkeys(mine, 0)
            while not self.stop.is_set():
                for conv in mine:
                    if self.stop.is_set():
                        return
                    if self._append(client, conv, turns[conv]):
                        turns[conv] += 1
                    prepare = f"/v1/conversations/{conv}/prepare"
                    self._call(client, "prepare", "POST", prepare, {"model": self.model})
                    if turns[conv] % 5 == 0:
                        self._call(client, "get", "GET", f"/v1/conversations/{conv}", None)
                    time.sleep(self.pause_s)

    def _append(self, client: httpx.Client, conv: str, i: int) -> bool:
        """Append turn `i` until it is known to be stored; False if stopped first."""
        body = {"messages": turn(conv, i), "model": self.model, "expected_length": 2 * i}
        while not self.stop.is_set():
            r = self._send(client, "append", "POST", f"/v1/conversations/{conv}/messages", body)
            if r is not None and r.status_code == 200:
                with self._lock:
                    self.acknowledged[conv] = i + 1
                    self.landed[conv] = i + 1
                return True
            if r is not None and r.status_code == 409:
                actual = r.json()["error"].get("actual")
                if actual == 2 * (i + 1):  # an earlier try landed after all
                    with self._lock:
                        self.landed[conv] = i + 1
                        self.confirmed += 1
                    return True
                raise AssertionError(f"{conv}: stored length {actual}, expected {2 * i}")
            time.sleep(0.05)
        return False

    def _call(self, client: httpx.Client, kind: str, method: str, path: str, body: Any) -> None:
        self._send(client, kind, method, path, body)

    def _send(
        self, client: httpx.Client, kind: str, method: str, path: str, body: Any
    ) -> httpx.Response | None:
        started = time.monotonic()
        try:
            r = client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            self._record(kind, None, started, type(exc).__name__)
            return None
        self._record(kind, r, started)
        return r


def _is_json(r: httpx.Response) -> bool:
    return r.headers.get("content-type", "").startswith("application/json")
