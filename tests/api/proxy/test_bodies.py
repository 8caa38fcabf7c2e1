"""A body that resends an earlier one's messages is parsed from where it differs, to the
same value as parsing it whole; the bodies kept are bounded, per tenant too."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from api.codec import NotStrictJSON, loads
from api.proxy.bodies import ResentBodies

BIG = "x" * 400  # messages long enough that the bodies (over 64 kB) are worth remembering


def session(n: int, extra: str = "") -> list[dict[str, Any]]:
    """`n` messages of a coding session (some not ASCII)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "Be careful. " + BIG}]
    for k in range(n):
        out.append({"role": "user", "content": f"step {k} ça va? {BIG}{extra}"})
        out.append({"role": "assistant", "content": f"done {k} 🙂", "n": [k, 1.5, None]})
    return out


def body(messages: list[dict[str, Any]], compact: bool = False, **fields: Any) -> bytes:
    value = {"model": "m", "messages": messages, **fields}
    if compact:  # as JavaScript's JSON.stringify sends it: no spaces, UTF-8 as is
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return json.dumps(value).encode()


def learned(bodies: ResentBodies, raw: bytes, tenant: str = "t") -> Any:
    """Parse `raw` as the proxy does (learning it when told to); its value."""
    value, learn = bodies.loads(tenant, raw)
    if learn:
        bodies.remember(tenant, raw, value)
    return value


@pytest.mark.parametrize("compact", [False, True])
def test_a_resent_body_is_parsed_from_its_new_messages(compact: bool) -> None:
    """Turn after turn: the same value as `loads`, the earlier messages as the earlier
    body's own objects, and nothing left to learn."""
    bodies = ResentBodies()
    learned(bodies, body(session(200), compact))
    raw = body(session(201), compact, stream=True, max_tokens=5)
    first, learn = bodies.loads("t", raw)
    assert first == loads(raw) and not learn
    raw = body(session(202), compact)  # the turn after: parsed from the one before
    value, learn = bodies.loads("t", raw)
    assert value == loads(raw) and not learn and list(value) == ["model", "messages"]
    kept = value["messages"][: len(first["messages"])]
    assert all(a is b for a, b in zip(kept, first["messages"], strict=True))
    assert value["messages"][-1] is not first["messages"][-1]


def test_a_message_edited_in_the_middle_is_parsed_again_from_there() -> None:
    """A message changed in place (same length) differs by its bytes: everything from it is
    parsed again, so the value is the edited one."""
    bodies = ResentBodies()
    learned(bodies, body(session(200)))
    edited = session(201)
    edited[150]["content"] = edited[150]["content"].replace("x", "y", 1)
    raw = body(edited)
    value, _ = bodies.loads("t", raw)
    assert value == loads(raw) and value["messages"][150] == edited[150]


@pytest.mark.parametrize(
    "raw",
    [
        body(session(201))[:-3],  # cut short
        body(session(201)).replace(b'"messages": [', b'"messages": {', 1),
        body(session(201))[:-1] + b', "x": NaN}',  # refused, as parsed whole
        body(session(201))[:-1] + b', "big": 123456789012345678901234567890}',
    ],
)
def test_a_resent_body_parses_or_fails_exactly_as_parsed_whole(raw: bytes) -> None:
    """Broken or unusual JSON after the shared messages: the same value or error as `loads`."""
    bodies = ResentBodies()
    learned(bodies, body(session(200)))
    try:
        expected = loads(raw)
    except ValueError as exc:
        with pytest.raises(ValueError, match=re.escape(str(exc)[:20])):
            bodies.loads("t", raw)
    else:
        value = bodies.loads("t", raw)[0]
        assert json.dumps(value) == json.dumps(expected)


def test_another_tenants_body_reuses_nothing() -> None:
    """Bodies are remembered per tenant: the same bytes from another are parsed whole."""
    bodies = ResentBodies()
    first = learned(bodies, body(session(200)), tenant="a")
    value, learn = bodies.loads("b", body(session(201)))
    assert learn and value["messages"][1] is not first["messages"][1]


def test_a_body_with_messages_nested_before_its_own_is_never_remembered() -> None:
    """A `messages` key inside an earlier field is not the body's: nothing is learned from
    such a body, and it and the next are still parsed right."""
    bodies = ResentBodies()
    odd = [{"role": "user", "content": BIG}] * 300
    meta = {"messages": [{"role": "user", "content": "not these"}]}
    raw = json.dumps({"model": "m", "metadata": meta, "messages": odd}).encode()
    assert learned(bodies, raw) == loads(raw)
    nxt = json.dumps({"model": "m", "metadata": meta, "messages": [*odd, odd[0]]}).encode()
    value, learn = bodies.loads("t", nxt)
    assert value == loads(nxt) and learn


def test_the_bodies_kept_are_bounded() -> None:
    """Past `max_bytes` (each body weighed with its parsed objects, 3x its length) the
    oldest bodies are forgotten (then parsed whole again)."""
    bodies = ResentBodies(max_bytes=1_000_000)  # three 107 kB bodies
    for k in range(5):
        learned(bodies, body(session(200, extra=str(k))), tenant=f"t{k}")
    assert bodies.loads("t4", body(session(201, extra="4")))[1] is False
    assert bodies.loads("t2", body(session(201, extra="2")))[1] is False
    assert bodies.loads("t1", body(session(201, extra="1")))[1] is True


def opened(k: int, n: int = 200) -> list[dict[str, Any]]:
    """A session whose opening (its first bytes, the bodies' key) is its own."""
    messages = session(n)
    return [{"role": "system", "content": f"session {k}. {BIG}"}, *messages[1:]]


def test_one_tenant_cannot_push_the_others_out() -> None:
    """A tenant holds at most `tenant_share` of the bytes: its own oldest bodies go first,
    another tenant's body stays."""
    bodies = ResentBodies(max_bytes=1_000_000)  # a tenant: one 107 kB body (322 kB weighed)
    learned(bodies, body(opened(0)), tenant="quiet")
    for k in range(1, 4):
        learned(bodies, body(opened(k)), tenant="busy")
    assert bodies.loads("quiet", body(opened(0, 201)))[1] is False
    assert bodies.loads("busy", body(opened(3, 201)))[1] is False
    assert bodies.loads("busy", body(opened(2, 201)))[1] is True
    assert bodies.loads("busy", body(opened(1, 201)))[1] is True


def test_a_body_heavier_than_a_tenants_share_is_not_kept() -> None:
    """A body whose weight exceeds one tenant's share is parsed whole every time."""
    bodies = ResentBodies(max_bytes=400_000)
    learned(bodies, body(session(200)))
    assert bodies.loads("t", body(session(201)))[1] is True


def test_adopted_messages_come_back_as_the_same_objects() -> None:
    """Messages adopted for a body (the store's equal objects) are what the next body that
    resends them gets; adopting for a body no longer the one kept changes nothing."""
    bodies = ResentBodies()
    learned(bodies, body(session(200)))
    raw = body(session(201))
    value, _ = bodies.loads("t", raw)
    stored = [dict(m) for m in value["messages"]]
    bodies.adopt("t", body(session(201)), stored)  # equal bytes, another object: ignored
    bodies.adopt("t", raw, stored)
    nxt, _ = bodies.loads("t", body(session(202)))
    assert all(a is b for a, b in zip(nxt["messages"], stored, strict=False))
    assert nxt == loads(body(session(202)))


def test_a_nan_in_a_resent_bodys_new_messages_is_refused_with_its_place() -> None:
    """Parsed from where it differs, a body is as strict as parsed whole: the new message's
    NaN is refused, naming it."""
    bodies = ResentBodies()
    learned(bodies, body(session(200)))
    raw = body(session(201))[:-2] + b', {"role": "user", "content": "x", "w": NaN}]}'
    with pytest.raises(NotStrictJSON, match=r"at messages\[403\]\.w"):
        bodies.loads("t", raw)
