"""The scripted provider of bench/agents: its window, its error shapes, its script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from bench.agents.brain import Brain, Script, Tokens

BASH = {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {}}}}
SHELL = {
    "type": "function",
    "name": "shell",
    "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
}


@pytest.fixture
def brain(tmp_path: Path, tiktoken_dir: Path) -> TestClient:
    """A brain with a 300-token window and 3 turns, logging to a temporary file."""
    script = Script(window=300, turns=3, output_kb=1)
    return TestClient(Brain(script, Tokens(tiktoken_dir), tmp_path / "log.jsonl").app())


def test_anthropic_overflow_shapes(brain: TestClient) -> None:
    """A prompt over the window, or with max_tokens over it, gets Anthropic's two messages."""
    long = {"role": "user", "content": "TASK-MARKER-ab12 " + "word " * 400}
    short = {"role": "user", "content": "TASK-MARKER-ab12 go"}
    over = brain.post("/v1/messages", json={"model": "m", "max_tokens": 10, "messages": [long]})
    assert over.status_code == 400
    assert over.json()["error"]["message"].startswith("prompt is too long: ")
    assert "tokens > 300 maximum" in over.json()["error"]["message"]
    reply = brain.post("/v1/messages", json={"model": "m", "max_tokens": 299, "messages": [short]})
    assert reply.status_code == 400
    assert "input length and `max_tokens` exceed context limit" in reply.json()["error"]["message"]


def test_chat_overflow_code(brain: TestClient) -> None:
    """OpenAI Chat Completions over the window is a 400 with code context_length_exceeded."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x " * 600}]}
    answer = brain.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"


def test_responses_stream_calls_the_shell_with_its_schema(brain: TestClient) -> None:
    """A streamed Responses request gets the documented event sequence and an array command."""
    body = {
        "model": "m",
        "stream": True,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "TASK-MARKER-ab12"}]}
        ],
        "tools": [SHELL],
    }
    with brain.stream("POST", "/v1/responses", json=body) as answer:
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    item = events[-1]["response"]["output"][0]
    command = json.loads(item["arguments"])["command"]
    assert command[:2] == ["bash", "-lc"] and "AGENTRUN sid=ab12 turn=1" in command[2]
    assert events[-1]["response"]["usage"]["input_tokens"] > 0


def test_last_turn_gets_the_final_text(brain: TestClient) -> None:
    """Once the transcript holds the last scripted turn, the answer is text, not a tool call."""
    messages = [
        {"role": "user", "content": "TASK-MARKER-ab12 go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "Bash",
             "input": {"command": "echo 'AGENTRUN sid=ab12 turn=3'"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "AGENTRUN sid=ab12 turn=3"}]},
    ]  # fmt: skip
    body = {"model": "m", "max_tokens": 10, "messages": messages, "tools": [BASH]}
    answer = brain.post("/v1/messages", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["content"][0]["type"] == "text"
