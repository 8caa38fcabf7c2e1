"""Key formats: versioned, tenant-namespaced, one cluster slot per tenant, safe ids only."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from shared import keys
from shared.errors import ConfigError, InvalidId
from shared.hashing import prefix_hash

H = prefix_hash([])


def _tenant_keys(tenant: str, conv: str) -> list[str]:
    return [
        keys.conv_messages(tenant, conv),
        keys.conv_hashes(tenant, conv),
        keys.conv_meta(tenant, conv),
        keys.conv_index(tenant, conv),
        keys.conv_lease(tenant, conv),
        keys.conv_pending(tenant, conv, "upto-3"),
        keys.record(tenant, H),
        keys.record_refs(tenant, H),
        keys.usage(tenant),
        keys.dead_letters(tenant),
        keys.ratio(tenant, "gpt-4o"),
        keys.ratio(tenant, "x:y*{z}"),
        keys.conv_blocked(tenant, conv),
        keys.conv_block_count(tenant, conv),
        keys.conv_attempts(tenant, conv, H),
    ]


def test_keys_are_versioned_and_carry_the_tenant_hash_tag() -> None:
    """Every tenant key starts with prefit:v2:{tenant}: and all are distinct."""
    found = _tenant_keys("acme", "c1")
    assert all(k.startswith("prefit:v2:{acme}:") for k in found)
    assert len(set(found)) == len(found)
    assert keys.conv_messages("acme", "c1") == "prefit:v2:{acme}:conv:c1:msgs"


def test_a_tenants_keys_share_one_cluster_slot() -> None:
    """Conversation and record keys of one tenant hash to one slot (the Lua scripts need it)."""
    assert len({key_slot(k.encode()) for k in _tenant_keys("acme", "c1")}) == 1


def test_record_keys_build_from_prefix_and_suffix() -> None:
    """The Lua scripts' concatenation gives exactly the keys keys.py formats."""
    assert keys.record("t", H) == keys.record_prefix("t") + H
    assert keys.record_refs("t", H) == keys.record_prefix("t") + H + keys.REFS_SUFFIX


@pytest.mark.parametrize("tenant", ["", "a:b", "a{b", "a}b", "a b", "-a", "x" * 65, "ü"])
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
        keys.record("t", value)


def test_ratio_keys_are_per_tenant_and_model() -> None:
    """A tenant's ratio of a model is its own key; plain names stay readable, others digest."""
    assert keys.ratio("acme", "gpt-4o") == "prefit:v2:{acme}:ratio:gpt-4o"
    assert keys.ratio("acme", "openai/gpt-4o") == "prefit:v2:{acme}:ratio:openai/gpt-4o"
    assert keys.ratio("acme", None) == keys.ratio("acme", "") == "prefit:v2:{acme}:ratio:~"
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
