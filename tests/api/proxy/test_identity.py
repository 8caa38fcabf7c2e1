"""Identity: the caller (either SDK's key header, the opt-in provider key) and the
conversation (the header, then each client's session signal, then the head)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from api.auth import KeyRing
from api.proxy.identity import (
    conversation_id,
    conversation_ids,
    derived_id,
    identify,
    session_signal,
)
from shared.errors import InvalidRequest, Unauthorized
from shared.formats import from_anthropic, to_anthropic
from shared.head import task_digest
from shared.messages import Message
from shared.settings import Settings
from tests.api.proxy.conftest import Proxy, wait_for
from tests.builders import assistant, user
from tests.shared import aider, preambles

SYSTEM: Message = {"role": "system", "content": "You are a careful agent."}
HEAD = [SYSTEM, user("Fix the flaky test in tests/test_cache.py")]
SESSION = "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"
OTHER = "0c6f1b2a-7d4e-4f3a-9b1c-2e5d8a7f6c3b"
CLAUDE_JSON = json.dumps({"device_id": "d", "account_uuid": "", "session_id": SESSION})


def cid(headers: dict[str, str], body: dict[str, Any], msgs: list[Message] = HEAD) -> str:
    """The id of a request of tenant `a`."""
    return conversation_id(headers, body, "a", msgs)


def test_the_header_names_the_conversation_before_any_signal() -> None:
    """X-Prefit-Conversation wins over every session signal; a bad one is refused."""
    headers = {"x-prefit-conversation": "chat-7", "x-session-id": "ses_1"}
    assert cid(headers, {"prompt_cache_key": SESSION}) == "chat-7"
    with pytest.raises(InvalidRequest):
        cid({"x-prefit-conversation": "has space"}, {})


@pytest.mark.parametrize(
    ("headers", "body", "client"),
    [
        ({"X-Claude-Code-Session-Id": SESSION}, {}, "claude"),
        ({}, {"metadata": {"user_id": f"user_ab12_account_{OTHER}_session_{SESSION}"}}, "claude"),
        ({}, {"metadata": {"user_id": f"user_ab12_account__session_{SESSION}"}}, "claude"),
        ({}, {"metadata": {"user_id": CLAUDE_JSON}}, "claude"),
        ({"thread-id": SESSION, "session-id": OTHER}, {}, "codex"),
        ({"session-id": SESSION}, {}, "codex"),
        ({"session_id": SESSION, "conversation_id": SESSION}, {}, "codex"),
        ({}, {"prompt_cache_key": SESSION}, "codex"),
        ({"x-session-id": "ses_4f2a", "x-session-affinity": "ses_4f2a"}, {}, "opencode"),
        ({"x-session-affinity": "ses_4f2a"}, {}, "opencode"),
    ],
)  # fmt: skip
def test_each_clients_session_signal_names_the_conversation(
    headers: dict[str, str], body: dict[str, Any], client: str
) -> None:
    """What Claude Code, Codex and opencode send is read as their session."""
    found = session_signal(headers, body)
    assert found is not None and found[0] == client
    got = cid(headers, body)
    assert got.startswith(f"{client}-") and got != derived_id("a", HEAD)
    assert len(got) <= 128


@pytest.mark.parametrize(
    "body",
    [
        {"user": "alice@example.com"},
        {"safety_identifier": "hashed-alice"},
        {"metadata": {"user_id": "u-1"}},  # a person, as the anthropic SDK documents it
        {"metadata": {"user_id": "{not json"}},
        {"prompt_cache_key": "support-bot-v3"},  # a cache bucket apps share on purpose
    ],
)
def test_people_and_cache_buckets_are_not_sessions(body: dict[str, Any]) -> None:
    """Per-person ids and non-UUID cache keys leave the id to the head."""
    assert session_signal({"x-session-id": "  "}, body) is None
    assert cid({}, body) == derived_id("a", HEAD)


def test_tenants_never_share_a_conversation() -> None:
    """The same session signal or head under two tenants gives two ids."""
    headers = {"x-claude-code-session-id": SESSION}
    assert conversation_id(headers, {}, "a", HEAD) != conversation_id(headers, {}, "b", HEAD)
    assert derived_id("a", HEAD) != derived_id("b", HEAD)


def test_one_session_keeps_its_id_and_its_side_transcripts_get_their_own() -> None:
    """Later turns keep the session's id; a sub-agent (another head) in it gets another."""
    headers = {"x-claude-code-session-id": SESSION}
    first = cid(headers, {})
    assert cid(headers, {}, [*HEAD, assistant("looking"), user("go on")]) == first
    sub = [{"role": "system", "content": "You are a search sub-agent."}, user("find tests")]
    assert cid(headers, {}, sub) != first
    assert cid({"x-claude-code-session-id": OTHER}, {}) != first


def claude_code_turn(turn: int) -> list[Message]:
    """A Claude Code request at `turn`, as prefit reads it: the billing line renewed and the
    `cache_control` marker moved to the latest user message, the rest resent unchanged."""
    marker = {"type": "ephemeral"}
    system: list[dict[str, Any]] = [
        {
            "type": "text",
            "text": f"x-anthropic-billing-header: cc_version=2.1.80.{turn:03x}; cch={turn:05x};",
        },
        {"type": "text", "text": "You are Claude Code.", "cache_control": marker},
    ]
    first = [
        {"type": "text", "text": "<system-reminder>CLAUDE.md says: be brief</system-reminder>"},
        {"type": "text", "text": "Rename the cache module"},
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    for k in range(turn):
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": f"step {k}"}]},
            {"role": "user", "content": [{"type": "text", "text": f"continue {k}"}]},
        ]
    last = messages[-1]["content"][-1]
    last["cache_control"] = marker
    return from_anthropic(system, messages)


def test_moved_cache_markers_and_a_renewed_billing_line_keep_one_id() -> None:
    """Claude Code moves cache_control and renews its billing line each turn: one id."""
    ids = {derived_id("a", claude_code_turn(t)) for t in range(4)}
    assert len(ids) == 1
    other = claude_code_turn(2)
    other[1] = {**other[1], "content": [{"type": "text", "text": "Delete the cache module"}]}
    assert derived_id("a", other) not in ids


def test_aider_sessions_on_different_tasks_get_different_ids_each_kept_throughout() -> None:
    """Same template, different tasks: two ids, each the same at every turn (the reminder
    aider appends to the latest request aside)."""
    one = {derived_id("a", p) for p in aider.prompts("Add a --verbose flag to cli.py", 8)}
    two = {derived_id("a", p) for p in aider.prompts("Port utils.py to pathlib", 8)}
    assert len(one) == 1 and len(two) == 1 and one != two


def test_aider_with_examples_in_its_system_prompt_offers_the_sessions_id_at_the_second() -> None:
    """With the examples in the system prompt, aider's "I updated the files." note reads as a
    few-shot close until it recurs: the second prompt's other reading is the session's id."""
    prompts = aider.prompts("Port utils.py", 8, examples=False)
    ids = [conversation_ids({}, {}, "a", p) for p in prompts]
    session = ids[0][0]
    assert [i for i in ids if i[0] != session] == [ids[1]]
    assert ids[1][1] == session
    assert all(len(i) == 1 for k, i in enumerate(ids) if k != 1)


def test_a_learned_preamble_gives_each_session_its_own_id() -> None:
    """Same preamble, different tasks: one id by the transcript alone, one each once the
    tenant's memory names the preamble, the same at every turn."""
    tasks = ("Fix the login bug", "Add a dark mode")
    plain = {derived_id("a", preambles.prompts(t, 1)[0]) for t in tasks}
    assert len(plain) == 1  # the transcript alone cannot tell them apart
    learned = frozenset({task_digest({"role": "user", "content": preambles.PREAMBLE})})
    ids = [{derived_id("a", p, learned) for p in preambles.prompts(t, 6)} for t in tasks]
    assert len(ids[0]) == len(ids[1]) == 1 and ids[0] != ids[1]


def claude_code_body(turn: int, system: str = "You are Claude Code.") -> dict[str, Any]:
    """Claude Code's request at `turn` of a session: the billing line renewed, `cache_control`
    moved onto the newest blocks, tool use and results between, its session in the metadata."""
    marker = {"type": "ephemeral"}
    billing = f"x-anthropic-billing-header: cc_version=2.1.80.{turn:03x}; cch={turn:05x};"
    task = [
        {"type": "text", "text": "<system-reminder>CLAUDE.md says: be brief</system-reminder>"},
        {"type": "text", "text": "Rename the cache module to store"},
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for k in range(turn):
        use = {"type": "tool_use", "id": f"t{k}", "name": "Bash", "input": {"command": f"ls {k}"}}
        done = {"type": "tool_result", "tool_use_id": f"t{k}", "content": "cache.py " * 200}
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": f"step {k}"}, use]},
            {"role": "user", "content": [done]},
        ]
    messages[-1]["content"][-1]["cache_control"] = marker
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": billing},
            {"type": "text", "text": system, "cache_control": marker},
        ],
        "messages": messages,
        "metadata": {"user_id": f"user_{'0' * 64}_account__session_{SESSION}"},
    }


def test_a_long_claude_code_session_keeps_one_id_and_its_side_requests_get_their_own() -> None:
    """40 turns of moved markers and renewed billing lines: one id; a title request and a
    sub-agent of the same session (other system prompts): ids of their own."""

    def cc_id(body: dict[str, Any]) -> str:
        return conversation_id({}, body, "a", from_anthropic(body["system"], body["messages"]))

    ids = {cc_id(claude_code_body(t)) for t in range(40)}
    assert len(ids) == 1 and next(iter(ids)).startswith("claude-")
    title = cc_id(claude_code_body(0, "Generate a concise title for this conversation."))
    sub = cc_id(claude_code_body(3, "You are a file search specialist for Claude Code."))
    assert len({*ids, title, sub}) == 3


def post_chat(proxy: Proxy, messages: list[Message]) -> httpx.Response:
    """One chat completion through the proxy, returned once the proxy has stored its
    transcript. An agent's next prompt follows the answer, and the sync after the answer is
    what that prompt's identity reads; sent at once, it raced the sync (on a cold Redis
    Cluster the sync lost, and the session split)."""
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {proxy.key}"},
        json={"model": proxy.model, "messages": messages},
        timeout=30,
    )
    if r.status_code == 200:
        conv = r.headers["x-prefit-conversation"]
        wait_for(lambda: proxy.info(conv).get("length") == len(messages))
    return r


def test_two_concurrent_aider_sessions_are_two_stored_conversations(proxy: Proxy) -> None:
    """Interleaved prompts of two aider sessions land in two conversations, each kept."""
    first = aider.prompts("Add a --verbose flag to cli.py", 4, answer_chars=200, file_chars=200)
    second = aider.prompts("Port utils.py to pathlib", 4, answer_chars=200, file_chars=200)
    seen: dict[int, set[str]] = {0: set(), 1: set()}
    for a, b in zip(first, second, strict=True):
        for k, prompt in enumerate((a, b)):
            r = post_chat(proxy, prompt)
            assert r.status_code == 200
            seen[k].add(r.headers["x-prefit-conversation"])
    assert len(seen[0]) == len(seen[1]) == 1 and seen[0] != seen[1]


@pytest.mark.slow
def test_long_concurrent_aider_sessions_fit_with_their_tasks_in_every_prompt(
    proxy: Proxy,
) -> None:
    """Two interleaved aider sessions far past the window: no overflow, each forwarded
    prompt holds its own session's task, two conversations."""
    tasks = ("Add a --verbose flag to cli.py", "Port utils.py to pathlib")
    sessions = [aider.prompts(t, 24, answer_chars=3000, file_chars=3000) for t in tasks]
    assert len(str(sessions[0][-1])) > 4 * 20_000  # well past the window
    ids: list[set[str]] = [set(), set()]
    fitted = 0
    for step in range(24):
        for k in (0, 1):
            r = post_chat(proxy, sessions[k][step])
            assert r.status_code == 200, (step, k)
            ids[k].add(r.headers["x-prefit-conversation"])
            fitted += r.headers["x-prefit-fit"] == "applied"
            sent = str(proxy.fake.received[-1].body["messages"])
            assert tasks[k] in sent and tasks[1 - k] not in sent, (step, k)
    assert all(got.status == 200 for got in proxy.fake.received)  # never over the window
    assert len(ids[0]) == len(ids[1]) == 1 and ids[0] != ids[1]
    assert fitted > 10


def test_anthropic_requests_read_claude_codes_session(proxy: Proxy) -> None:
    """Through the proxy, Claude Code's metadata session names the conversation."""
    system, messages = to_anthropic(HEAD)
    body = {
        "model": proxy.model,
        "max_tokens": 64,
        "system": system,
        "messages": messages,
        "metadata": {"user_id": CLAUDE_JSON},
    }
    r = httpx.post(
        f"{proxy.url}/v1/messages", headers={"x-api-key": proxy.key}, json=body, timeout=30
    )
    assert r.status_code == 200
    assert r.headers["x-prefit-conversation"].startswith("claude-")


@pytest.mark.slow
def test_a_long_aider_session_with_its_examples_in_the_system_prompt_is_one_conversation(
    proxy: Proxy,
) -> None:
    """40 prompts of aider with its examples in the system prompt, far past the window: one
    conversation, the task in every forwarded prompt, no overflow."""
    task = "Add a --verbose flag to cli.py"
    prompts = aider.prompts(task, 40, examples=False, answer_chars=2000, file_chars=2000)
    ids = set()
    for step, prompt in enumerate(prompts):
        r = post_chat(proxy, prompt)
        assert r.status_code == 200, step
        ids.add(r.headers["x-prefit-conversation"])
        assert task in str(proxy.fake.received[-1].body["messages"]), step
    assert len(ids) == 1
    assert proxy.fake.received[-1].body["messages"] != prompts[-1]  # fitted, not forwarded as is
    assert all(got.status == 200 for got in proxy.fake.received)


def test_the_third_conversation_behind_a_learned_preamble_keeps_its_task(proxy: Proxy) -> None:
    """A tenant's conversations open with the same instruction block: the first loses its task
    past the window (the transcript alone takes the block for it), the next ones keep theirs
    in every prompt once the memory learned the block; three conversations."""
    tasks = ("Fix the login bug in auth.py", "Add a dark mode toggle", "Port the CLI to click")
    ids: list[set[str]] = [set(), set(), set()]
    kept: list[list[bool]] = [[], [], []]
    fitted = 0
    for k, steps in enumerate((24, 1, 24)):
        for prompt in preambles.prompts(tasks[k], steps):
            r = post_chat(proxy, prompt)
            assert r.status_code == 200, (k, len(prompt))
            ids[k].add(r.headers["x-prefit-conversation"])
            kept[k].append(tasks[k] in str(proxy.fake.received[-1].body["messages"]))
            fitted += k == 2 and r.headers["x-prefit-fit"] == "applied"
    assert fitted > 5
    assert not all(kept[0])  # without the memory the task is cut: the test can tell
    assert all(kept[2])
    assert all(len(i) == 1 for i in ids) and len(set.union(*ids)) == 3
    assert all(got.status == 200 for got in proxy.fake.received)


def test_a_long_claude_code_session_through_the_proxy_is_one_conversation(proxy: Proxy) -> None:
    """Claude Code's turns through /v1/messages, past the window: one conversation."""
    ids = set()
    for turn in range(0, 40, 3):
        body = {**claude_code_body(turn), "model": proxy.model}
        r = httpx.post(
            f"{proxy.url}/v1/messages", headers={"x-api-key": proxy.key}, json=body, timeout=30
        )
        assert r.status_code == 200, turn
        ids.add(r.headers["x-prefit-conversation"])
    assert len(ids) == 1 and next(iter(ids)).startswith("claude-")


def test_two_concurrent_aider_sessions_with_examples_in_the_system_prompt(proxy: Proxy) -> None:
    """Interleaved, the second prompts of two such sessions each find their own session's
    id (the other reading of the note names it), never the other's."""
    tasks = ("Add a --verbose flag to cli.py", "Port utils.py to pathlib")
    sessions = [aider.prompts(t, 8, examples=False, answer_chars=300) for t in tasks]
    ids: list[set[str]] = [set(), set()]
    for step in range(8):
        for k in (0, 1):
            r = post_chat(proxy, sessions[k][step])
            assert r.status_code == 200, (step, k)
            ids[k].add(r.headers["x-prefit-conversation"])
    assert len(ids[0]) == len(ids[1]) == 1 and ids[0] != ids[1]


@pytest.mark.slow
def test_an_aider_run_session_keeps_the_persons_request_in_every_forwarded_prompt(
    proxy: Proxy,
) -> None:
    """aider's `/run` session far past the window, its request answered "Understood. Send me
    the first build log." before the logs: every forwarded prompt holds that request."""
    request = "Help me get rid of the build warnings in this C project; I will paste each log."
    prompts = aider.run_prompts(request, 41, log_chars=4000, map_chars=4000)
    assert len(str(prompts[-1])) > 4 * 20_000  # well past the window
    for step, prompt in enumerate(prompts):
        r = post_chat(proxy, prompt)
        assert r.status_code == 200, step
        assert request in str(proxy.fake.received[-1].body["messages"]), step
    assert proxy.fake.received[-1].body["messages"] != prompts[-1]  # fitted, not forwarded as is
    assert all(got.status == 200 for got in proxy.fake.received)


def test_the_derived_id_is_the_heads_and_the_tenants() -> None:
    """Same head and tenant: same id, turn after turn; another tenant or head: another."""
    head = [{"role": "system", "content": "s"}, user("task")]
    one = derived_id("a", head)
    assert derived_id("a", [*head, assistant("x"), user("y")]) == one
    assert derived_id("b", head) != one
    assert derived_id("a", [{"role": "system", "content": "s"}, user("other")]) != one
    assert conversation_id({"x-prefit-conversation": "chat-7"}, {}, "a", head) == "chat-7"
    with pytest.raises(InvalidRequest):
        conversation_id({"x-prefit-conversation": "has space"}, {}, "a", head)


KEYS = KeyRing.parse("acme:prefit-key")


def test_either_sdk_header_authenticates_and_the_prefit_key_is_never_forwarded() -> None:
    """Bearer or x-api-key name the tenant; without the opt-in nothing of the client's goes up."""
    off = Settings(proxy_forward_client_keys=False)
    assert identify({"authorization": "Bearer prefit-key"}, KEYS, off).tenant == "acme"
    assert identify({"x-api-key": "prefit-key"}, KEYS, off).tenant == "acme"
    both = {"x-prefit-api-key": "prefit-key", "authorization": "Bearer sk-own"}
    assert identify(both, KEYS, off).provider_auth == {}
    with pytest.raises(Unauthorized):
        identify({}, KEYS, off)
    with pytest.raises(Unauthorized):
        identify({"x-api-key": "nope"}, KEYS, off)


def test_the_opt_in_forwards_the_clients_own_provider_key_only() -> None:
    """With X-Prefit-Api-Key, the SDK's own key header goes upstream; prefit's never does."""
    on = Settings(proxy_forward_client_keys=True)
    both = {"x-prefit-api-key": "prefit-key", "authorization": "Bearer sk-own"}
    assert identify(both, KEYS, on).provider_auth == {"authorization": "Bearer sk-own"}
    same = {"x-prefit-api-key": "prefit-key", "x-api-key": "prefit-key"}
    assert identify(same, KEYS, on).provider_auth == {}
    plain = {"authorization": "Bearer prefit-key"}
    assert identify(plain, KEYS, on).provider_auth == {}  # the only key there is prefit's
    open_mode = identify({"x-api-key": "sk-own"}, KeyRing.parse(""), on)
    assert (open_mode.tenant, open_mode.provider_auth) == ("local", {"x-api-key": "sk-own"})
