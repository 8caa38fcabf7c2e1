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
    ]


def test_keys_are_versioned_and_carry_the_tenant_hash_tag() -> None:
    """Every tenant key starts with prefit:v1:{tenant}: and all are distinct."""
    found = _tenant_keys("acme", "c1")
    assert all(k.startswith("prefit:v1:{acme}:") for k in found)
    assert len(set(found)) == len(found)
    assert keys.conv_messages("acme", "c1") == "prefit:v1:{acme}:conv:c1:msgs"


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


def test_ratio_keys_are_global_per_model() -> None:
    """Calibration keys sit under the global namespace; no model has its own default key."""
    assert keys.ratio("gpt-4o") == "prefit:v1:global:ratio:gpt-4o"
    assert keys.ratio(None) == keys.ratio("") != keys.ratio("gpt-4o")
    with pytest.raises(ConfigError):
        keys.ratio("gpt 4o")
    with pytest.raises(ConfigError):
        keys.ratio("m" * 300)
