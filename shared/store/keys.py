"""Every Redis key prefit uses, and the checks on the ids that go into them.

Key formats live here and nowhere else. Every key starts with `prefit:v3:`; changing a format
means a new version, so old keys are simply never read again (v2: prefix hashes of version 2,
see shared/hashing.py, and calibration per tenant; v3: a hash tag per conversation).

The braces in every key are a Redis Cluster hash tag: keys with the same tag share a slot, and
every Lua script and MULTI may only touch one slot. Three kinds of tag:

- `{<tenant>/<conversation>}`: everything of one conversation (messages, prefix hashes, tally,
  metadata, its summary records and their index, the lease, pending-job markers, attempt budgets
  and blocks). A conversation's scripts stay in its slot, and a tenant's conversations spread
  over the whole cluster.
- `{<tenant>}`: what belongs to the tenant as a whole: calibration ratios, usage, dead letters,
  the memory of repeated openings (`opening`: hashes only, shared/store/openings.py), the ids
  of the provider's stored objects it created through the proxy (`owned`), and the
  *directory* of record copies by prefix hash (`directory`), which lets a forked conversation
  reuse a summary and a stateless prepare find one (shared/store/directory.py).
- `{inflight:<queue>}` and `{global:breakers}`: a summary queue's in-flight registry (ids and
  hashes of running jobs, never content) and the summarizer breakers (they describe a provider
  configuration: a digest of it, its failures and pause). Neither is a valid tenant id.

Calibration ratios are per tenant: what one tenant reports about a model's tokenizer never
changes how another tenant's prompts are counted.

Ids are restricted to `[A-Za-z0-9._-]`: no `:` (it separates key parts, so allowing it would let
two different ids build the same key), no braces (they would move the hash tag) and no `/` (it
separates tenant and conversation in a tag). Model names are not ids (clients choose them
freely): `model_part` keeps a plain name as it is and replaces any other by a digest, so no
model name can add a key part or move the hash tag.
"""

from __future__ import annotations

import hashlib
import re

from shared.errors import ConfigError, InvalidId

VERSION = "v3"
ROOT = f"prefit:{VERSION}"

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PREFIX_HASH = re.compile(r"v[0-9]+:[0-9a-f]{32}")
MAX_TENANT_CHARS = 64
MAX_ID_CHARS = 128
_MODEL = re.compile(r"[A-Za-z0-9._/-]{1,128}")
DIGEST_MARK = "~"  # outside the plain-name alphabet: a digest never equals a plain name


def check_tenant(tenant: str) -> str:
    """Return `tenant` if it is a valid tenant id, else raise `InvalidId`."""
    return _check_id("tenant", tenant, MAX_TENANT_CHARS)


def check_id(kind: str, value: str) -> str:
    """Return `value` if it is a valid conversation/marker id, else raise `InvalidId`."""
    return _check_id(kind, value, MAX_ID_CHARS)


def check_prefix_hash(value: str) -> str:
    """Return `value` if it looks like a `shared.hashing` prefix hash, else raise `ConfigError`."""
    if not isinstance(value, str) or not _PREFIX_HASH.fullmatch(value):
        raise ConfigError(f"invalid prefix hash {value!r}: expected 'v<N>:' and 32 hex digits")
    return value


def _check_id(kind: str, value: str, limit: int) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidId(f"invalid {kind} id: must be a non-empty string")
    if len(value) > limit:
        raise InvalidId(f"invalid {kind} id: longer than {limit} characters")
    if not _ID.fullmatch(value):
        raise InvalidId(
            f"invalid {kind} id {value!r}: use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def _tenant(tenant: str) -> str:
    return f"{ROOT}:{{{check_tenant(tenant)}}}"


def _conv(tenant: str, conv_id: str) -> str:
    return f"{ROOT}:{{{check_tenant(tenant)}/{check_id('conversation', conv_id)}}}"


def tenant_pattern(tenant: str) -> str:
    """A SCAN pattern matching every key of the tenant, its conversations' included."""
    return f"{ROOT}:{{{check_tenant(tenant)}[}}/]*"


# conversations -------------------------------------------------------------------------------


def conv_messages(tenant: str, conv_id: str) -> str:
    """LIST of canonical JSON messages."""
    return f"{_conv(tenant, conv_id)}:msgs"


def conv_hashes(tenant: str, conv_id: str) -> str:
    """LIST of prefix hashes: element i is the hash of the first i+1 messages."""
    return f"{_conv(tenant, conv_id)}:hashes"


def conv_meta(tenant: str, conv_id: str) -> str:
    """HASH of metadata (model, timestamps, token count); exists iff the conversation does."""
    return f"{_conv(tenant, conv_id)}:meta"


def conv_index(tenant: str, conv_id: str) -> str:
    """ZSET of the conversation's summary records: member prefix hash, score upto."""
    return f"{_conv(tenant, conv_id)}:summaries"


def conv_lease(tenant: str, conv_id: str) -> str:
    """STRING naming the one worker allowed to summarize the conversation."""
    return f"{_conv(tenant, conv_id)}:lease"


def conv_pending(tenant: str, conv_id: str, marker: str) -> str:
    """STRING marking that a task for (conversation, marker) is already queued."""
    return f"{_conv(tenant, conv_id)}:pending:{check_id('marker', marker)}"


def conv_pending_index(tenant: str, conv_id: str) -> str:
    """SET of the conversation's pending-job marker keys, so a delete can drop them all."""
    return f"{_conv(tenant, conv_id)}:pending-index"


# summary records -----------------------------------------------------------------------------


def record_prefix(tenant: str, conv_id: str) -> str:
    """What `record` puts before the prefix hash (Lua scripts build record keys from it)."""
    return f"{_conv(tenant, conv_id)}:rec:"


def record(tenant: str, conv_id: str, prefix_hash: str) -> str:
    """STRING holding one of the conversation's `SummaryRecord`s as JSON, by prefix hash."""
    return record_prefix(tenant, conv_id) + check_prefix_hash(prefix_hash)


REFS_SUFFIX = ":refs"


def directory(tenant: str, prefix_hash: str) -> str:
    """STRING: a copy of a record some conversation of the tenant holds for this prefix."""
    return f"{_tenant(tenant)}:dir:{check_prefix_hash(prefix_hash)}"


def directory_refs(tenant: str, prefix_hash: str) -> str:
    """SET of the conversation ids whose records the directory entry copies."""
    return directory(tenant, prefix_hash) + REFS_SUFFIX


# per-tenant bookkeeping ----------------------------------------------------------------------


def usage(tenant: str) -> str:
    """HASH of summary token and cost counters."""
    return f"{_tenant(tenant)}:usage"


def dead_letters(tenant: str) -> str:
    """LIST of JSON dead letters, newest first."""
    return f"{_tenant(tenant)}:deadletters"


_TASK_DIGEST = re.compile(r"[0-9a-f]{32}")


def opening(tenant: str, task_digest: str) -> str:
    """STRING: the `task_digest` of the user message that followed this opening (a
    `task_digest`) in the first conversation of the tenant it opened (shared/store/openings.py)."""
    if not isinstance(task_digest, str) or not _TASK_DIGEST.fullmatch(task_digest):
        raise ConfigError(f"invalid task digest {task_digest!r}: expected 32 hex digits")
    return f"{_tenant(tenant)}:opening:{task_digest}"


OWNED_KINDS = frozenset({"responses", "items"})  # provider objects the proxy reaches by id


def owned(tenant: str, kind: str) -> str:
    """ZSET of the ids of provider objects of `kind` (`OWNED_KINDS`) the tenant created
    through the proxy, scored by when (shared/store/ownership.py)."""
    if kind not in OWNED_KINDS:
        raise ConfigError(f"unknown kind of owned object {kind!r}")
    return f"{_tenant(tenant)}:owned:{kind}"


def ratio(tenant: str, model: str | None) -> str:
    """HASH of the tenant's calibration of `model` (None or "" for calls that named no model):
    `ratio` and `observations`."""
    return f"{_tenant(tenant)}:ratio:{model_part(model)}"


def model_part(model: str | None) -> str:
    """A model name as a key part: itself if it is 1-128 of `[A-Za-z0-9._/-]`, else `~` and
    the hex BLAKE2b-16 of its UTF-8 (`~` alone for no model). Never braces, spaces or `:`."""
    if model is None or model == "":
        return DIGEST_MARK
    if not isinstance(model, str):
        raise ConfigError(f"a model name must be a string, got {type(model).__name__}")
    if _MODEL.fullmatch(model):
        return model
    raw = model.encode("utf-8", "surrogatepass")
    return DIGEST_MARK + hashlib.blake2b(raw, digest_size=16).hexdigest()


# API bookkeeping (appended for the HTTP API) -------------------------------------------------


def conv_tally(tenant: str, conv_id: str) -> str:
    """LIST of running base token counts: element i counts the first i+1 messages."""
    return f"{_conv(tenant, conv_id)}:tally"


def conv_tally_info(tenant: str, conv_id: str) -> str:
    """HASH saying what the tally counts: `counter` id, chain tip `hash`, and `head_end`."""
    return f"{_conv(tenant, conv_id)}:tally-info"


BROKER_PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: "<queue><sep><priority>"
BROKER_PRIORITIES = tuple(range(10))


def broker_queues(queue: str) -> list[str]:
    """The broker's Redis LISTs of a Celery queue: one per priority step (0 is the bare name).

    These are kombu's formats, not ours; every step 0..9 is listed so the sum is right
    whichever `priority_steps` the workers run with.
    """
    return [queue if p == 0 else f"{queue}{BROKER_PRIORITY_SEP}{p}" for p in BROKER_PRIORITIES]


# worker fault handling (appended for the summary workers) -----------------------------------


def conv_blocked(tenant: str, conv_id: str) -> str:
    """HASH of a dead-lettered summary range (`from` record hex, `upto`, `prefix_hash`, `error`):
    no summary job starts from that record again until the key expires (a backoff)."""
    return f"{_conv(tenant, conv_id)}:blocked"


def conv_block_count(tenant: str, conv_id: str) -> str:
    """STRING counting the conversation's recent blocks: each one doubles the next backoff."""
    return f"{_conv(tenant, conv_id)}:blocks"


def conv_attempts(tenant: str, conv_id: str, prefix_hash: str) -> str:
    """STRING counting failed attempts at the summary ending at `prefix_hash`, shared by every
    job and retry planning it (one budget: `max_redeliveries`)."""
    digest = check_prefix_hash(prefix_hash).partition(":")[2]
    return f"{_conv(tenant, conv_id)}:attempts:{digest}"


def _worker_queue(queue: str) -> str:
    # the braces make the queue a Redis Cluster hash tag: a registry's keys share one slot;
    # queue names are the operator's, so any name makes a key part (as model names do)
    return f"{ROOT}:{{inflight:{model_part(queue)}}}"


def inflight_deadlines(queue: str) -> str:
    """ZSET of the queue's running summary jobs: member task id, score its lease deadline (ms)."""
    return f"{_worker_queue(queue)}:deadlines"


def conv_unsent(tenant: str, conv_id: str) -> str:
    """STRING: JSON of the conversation's summary job the broker refused (kwargs, priority),
    kept until a reaper sends it (shared/store/unsent.py)."""
    return f"{_conv(tenant, conv_id)}:unsent"


def unsent_index(queue: str) -> str:
    """ZSET of the conversations with an unsent job for the queue: member `tenant/conversation`
    (ids cannot contain `/`), score when it was first kept (ms)."""
    return f"{_worker_queue(queue)}:unsent"


def inflight_jobs(queue: str) -> str:
    """HASH of the queue's running summary jobs: task id -> JSON (task kwargs, retries)."""
    return f"{_worker_queue(queue)}:jobs"


_BREAKERS = f"{ROOT}:{{global:breakers}}"  # one slot: tripping one updates the index too


def breaker(provider: str) -> str:
    """HASH of one summarizer configuration's circuit breaker (failures, open `until` ms, probe)."""
    return f"{_BREAKERS}:breaker:{check_id('provider', provider)}"


def breakers() -> str:
    """HASH of every summarizer configuration that ever tripped: provider id -> label."""
    return f"{_BREAKERS}:index"
