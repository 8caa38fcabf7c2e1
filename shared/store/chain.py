"""Stored prefix-hash chains grow with `shared.hashing.extend_chain` (re-exported here).

A stored chain is keyed under `keys.VERSION`: a new hash version needs a new key version.
"""

from shared.hashing import EMPTY, extend_chain

__all__ = ["EMPTY", "extend_chain"]
