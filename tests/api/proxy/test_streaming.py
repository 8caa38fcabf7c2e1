"""Streamed answers: server-sent events cut whole wherever the bytes break."""

from __future__ import annotations

from api.proxy.streaming import Events


def test_events_are_cut_at_blank_lines_wherever_the_bytes_break() -> None:
    """Events split across chunks (and CRLF ones) come out whole and in order."""
    stream = b'data: {"a":1}\n\nevent: x\ndata: 2\r\n\r\ndata: [DONE]\n\n'
    for size in (1, 2, 3, 7, len(stream)):
        events = Events()
        out: list[bytes] = []
        for k in range(0, len(stream), size):
            out += events.feed(stream[k : k + size])
        assert out == [b'data: {"a":1}\n\n', b"event: x\ndata: 2\r\n\r\n", b"data: [DONE]\n\n"]
        assert events.rest() == b""
