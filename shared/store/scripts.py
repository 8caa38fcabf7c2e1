"""Lua shared by the conversation and record scripts.

Record keys are built inside Lua from `keys.record_prefix(tenant)` .. prefix hash (and
`keys.REFS_SUFFIX` for the set of conversations pointing at a record), passed in as ARGV, so
the formats still come only from shared/keys.py. Every key a script touches carries the
tenant's hash tag, so the scripts stay single-slot under Redis Cluster.
"""

from __future__ import annotations

# Push ARGV[first..last] onto a list in slices: Lua's unpack() is limited to a few thousand values.
PUSH = """
local function push(key, first, last)
  local i = first
  while i <= last do
    local j = math.min(i + 999, last)
    redis.call('RPUSH', key, unpack(ARGV, i, j))
    i = j + 1
  end
end
"""

# Drop one conversation's link to a record; the record goes once no conversation points at it.
UNLINK = """
local function unlink(index, conv, prefix, suffix, member)
  redis.call('ZREM', index, member)
  local refs = prefix .. member .. suffix
  redis.call('SREM', refs, conv)
  if redis.call('SCARD', refs) == 0 then
    redis.call('DEL', prefix .. member, refs)
  end
end
"""

# Refresh the retention of everything holding the conversation's text, its records included.
TOUCH = """
local function touch(ttl, prefix, suffix)
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
  for _, member in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
    redis.call('PEXPIRE', prefix .. member, ttl)
    redis.call('PEXPIRE', prefix .. member .. suffix, ttl)
  end
end
"""

# Metadata shared by append and replace: ARGV[4] now, ARGV[5] model, ARGV[6] token count.
META = """
local function set_meta(length)
  redis.call('HSETNX', KEYS[3], 'created_at', ARGV[4])
  redis.call('HSET', KEYS[3], 'updated_at', ARGV[4])
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[3], 'model', ARGV[5]) end
  if ARGV[6] ~= '' then
    redis.call('HSET', KEYS[3], 'tokens', ARGV[6], 'tokens_upto', length)
  end
end
"""

# KEYS: msgs, hashes, meta, index. ARGV: expected length, expected last hash ('' if none),
# ttl ms, now, model, tokens, record prefix, refs suffix, n, then n messages and n hashes.
APPEND = (
    PUSH
    + TOUCH
    + META
    + """
local len = redis.call('LLEN', KEYS[1])
local last = redis.call('LINDEX', KEYS[2], -1) or ''
if len ~= tonumber(ARGV[1]) or last ~= ARGV[2] then return {0, len} end
local n = tonumber(ARGV[9])
push(KEYS[1], 10, 9 + n)
push(KEYS[2], 10 + n, 9 + 2 * n)
set_meta(len + n)
touch(ARGV[3], ARGV[7], ARGV[8])
return {1, len + n}
"""
)

# KEYS as APPEND. ARGV: expected length ('' for any), conversation id, then as APPEND.
# Index entries whose prefix no longer matches the new content are unlinked.
REPLACE = (
    PUSH
    + UNLINK
    + TOUCH
    + META
    + """
local len = redis.call('LLEN', KEYS[1])
if ARGV[1] ~= '' and len ~= tonumber(ARGV[1]) then return {0, len} end
local n = tonumber(ARGV[9])
redis.call('DEL', KEYS[1], KEYS[2])
push(KEYS[1], 10, 9 + n)
push(KEYS[2], 10 + n, 9 + 2 * n)
local entries = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do
  local upto = tonumber(entries[i + 1])
  if redis.call('LINDEX', KEYS[2], upto - 1) ~= entries[i] then
    unlink(KEYS[4], ARGV[2], ARGV[7], ARGV[8], entries[i])
  end
end
set_meta(n)
touch(ARGV[3], ARGV[7], ARGV[8])
return {1, n}
"""
)

# KEYS: msgs, hashes, meta, index, then any other per-conversation keys to drop.
# ARGV: conversation id, record prefix, refs suffix.
DELETE = (
    UNLINK
    + """
local existed = redis.call('EXISTS', KEYS[3])
for _, member in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  unlink(KEYS[4], ARGV[1], ARGV[2], ARGV[3], member)
end
redis.call('DEL', unpack(KEYS))
return existed
"""
)

# KEYS: msgs, meta. ARGV: tokens, upto. Caches a token count only for the current length.
SET_TOKENS = """
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if redis.call('LLEN', KEYS[1]) ~= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[2], 'tokens', ARGV[1], 'tokens_upto', ARGV[2])
return 1
"""
