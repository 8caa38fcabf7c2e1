"""Key formats: versioned, tenant-namespaced, one cluster slot per conversation and one per
tenant, safe ids only. (That no store operation crosses slots is checked on the operations
themselves: tests/shared/store/test_slots.py.)"""

from __future__ import annotations

import fnmatch
import re

import pytest
from redis.crc import key_slot

from shared.errors import ConfigError, InvalidId
from shared.hashing import prefix_hash
from shared.store import keys

H = prefix_hash([])


def _conversation_keys(tenant: str, conv: str) -> list[str]:
    return [
        keys.conv_messages(tenant, conv),
        keys.conv_hashes(tenant, conv),
        keys.conv_meta(tenant, conv),
        keys.conv_index(tenant, conv),
        keys.conv_lease(tenant, conv),
        keys.conv_pending(tenant, conv, "upto-3"),
        keys.record(tenant, conv, H),
        keys.conv_tally(tenant, conv),
        keys.conv_tally_info(tenant, conv),
        keys.conv_blocked(tenant, conv),
        keys.conv_block_count(tenant, conv),
        keys.conv_attempts(tenant, conv, H),
    ]


def _tenant_keys(tenant: str) -> list[str]:
    return [
        keys.usage(tenant),
        keys.dead_letters(tenant),
        keys.ratio(tenant, "gpt-4o"),
        keys.ratio(tenant, "x:y*{z}"),
        keys.directory(tenant, H),
        keys.directory_refs(tenant, H),
        keys.opening(tenant, "0" * 32),
    ]


def _slots(found: list[str]) -> set[int]:
    return {key_slot(k.encode()) for k in found}


def test_keys_are_versioned_and_carry_their_hash_tag() -> None:
    """Conversation keys start with prefit:v3:{tenant/conversation}:, tenant keys with
    prefit:v3:{tenant}:, and all are distinct."""
    conv, tenant = _conversation_keys("acme", "c1"), _tenant_keys("acme")
    assert all(k.startswith("prefit:v3:{acme/c1}:") for k in conv)
    assert all(k.startswith("prefit:v3:{acme}:") for k in tenant)
    assert len(set(conv + tenant)) == len(conv + tenant)
    assert keys.conv_messages("acme", "c1") == "prefit:v3:{acme/c1}:msgs"


def test_a_conversations_keys_share_one_slot_and_a_tenants_another() -> None:
    """Every key of one conversation hashes to one slot (its scripts need it), every tenant
    key to the tenant's; conversations of one tenant spread over the slots."""
    assert len(_slots(_conversation_keys("acme", "c1"))) == 1
    assert len(_slots(_tenant_keys("acme"))) == 1
    spread = _slots([keys.conv_meta("acme", f"c{i}") for i in range(50)])
    assert len(spread) > 40


def test_global_keys_share_their_own_slots() -> None:
    """The breakers (one script trips a breaker and updates their index) share one slot; their
    tag is not a tenant id, so no tenant's keys share it by name."""
    found = [keys.breaker("p1"), keys.breaker("p2"), keys.breakers()]
    assert len(_slots(found)) == 1
    assert all(k.startswith("prefit:v3:{global:breakers}:") for k in found)


def test_the_tenant_pattern_matches_the_tenants_keys_only() -> None:
    """`tenant_pattern` (SCAN MATCH) covers a tenant's keys and its conversations', and no
    other tenant's, not even one whose id extends it."""
    regex = re.compile(fnmatch.translate(keys.tenant_pattern("acme")))
    for key in _conversation_keys("acme", "c1") + _tenant_keys("acme"):
        assert regex.match(key), key
    for key in _conversation_keys("acme2", "c1") + _tenant_keys("acme-b"):
        assert not regex.match(key), key


def test_record_keys_build_from_their_prefix() -> None:
    """The Lua scripts' concatenation gives exactly the keys keys.py formats."""
    assert keys.record("t", "c", H) == keys.record_prefix("t", "c") + H
    assert keys.directory_refs("t", H) == keys.directory("t", H) + keys.REFS_SUFFIX


@pytest.mark.parametrize("tenant", ["", "a:b", "a{b", "a}b", "a/b", "a b", "-a", "x" * 65, "ü"])
def test_bad_tenant_ids_are_refused(tenant: str) -> None:
    """Tenant ids outside [A-Za-z0-9._-] (or too long, or empty) raise InvalidId."""
    with pytest.raises(InvalidId):
        keys.conv_meta(tenant, "c")


@pytest.mark.parametrize("value", [None, 3, b"abc"])
def test_non_string_ids_are_refused(value: object) -> None:
    """Ids must be strings."""
    with pytest.raises(InvalidId):
        keys.conv_meta("t", value)  # type: ignore[arg-type]


def test_longest_valid_ids_are_accepted() -> None:
    """A 64-character tenant and a 128-character conversation id are fine."""
    assert keys.conv_meta("t" * 64, "c" * 128).endswith(":meta")


@pytest.mark.parametrize("value", ["", "v1:abc", "x1:" + "0" * 32, "v1:" + "0" * 31 + "G"])
def test_bad_prefix_hashes_are_refused(value: str) -> None:
    """Record keys take only well-formed prefix hashes."""
    with pytest.raises(ConfigError):
        keys.record("t", "c", value)


def test_ratio_keys_are_per_tenant_and_model() -> None:
    """A tenant's ratio of a model is its own key; plain names stay readable, others digest."""
    assert keys.ratio("acme", "gpt-4o") == "prefit:v3:{acme}:ratio:gpt-4o"
    assert keys.ratio("acme", "openai/gpt-4o") == "prefit:v3:{acme}:ratio:openai/gpt-4o"
    assert keys.ratio("acme", None) == keys.ratio("acme", "") == "prefit:v3:{acme}:ratio:~"
    assert keys.ratio("acme", "gpt-4o") != keys.ratio("other", "gpt-4o")
    odd = keys.ratio("acme", "x:y*{z}")
    assert odd.count("{") == 1 and odd.count("}") == 1 and odd.count(":") == 4
    assert keys.ratio("acme", "m" * 129) != keys.ratio("acme", "m" * 128)
    with pytest.raises(ConfigError):
        keys.ratio("acme", 3)  # type: ignore[arg-type]


def test_a_queues_inflight_registry_is_one_slot_whatever_its_name() -> None:
    """The registry's two keys share a slot per queue; any queue name makes a key part."""
    for queue in ("summaries", "team:a {b}"):
        deadlines, jobs = keys.inflight_deadlines(queue), keys.inflight_jobs(queue)
        assert deadlines.startswith(f"{keys.ROOT}:{{inflight:")
        assert key_slot(deadlines.encode()) == key_slot(jobs.encode())
        assert deadlines.count("{") == 1 and " " not in deadlines
    assert keys.inflight_jobs("a") != keys.inflight_jobs("b")


@pytest.mark.parametrize("value", ["", "0" * 31, "G" * 32, "0" * 32 + "}", "v2:" + "0" * 32])
def test_opening_keys_take_message_keys_only(value: str) -> None:
    """An opening key is built from 32 lowercase hex digits, nothing else."""
    with pytest.raises(ConfigError):
        keys.opening("acme", value)
