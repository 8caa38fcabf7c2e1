"""Lua shared by the conversation and record scripts, and the two scripts that write a
conversation: `APPEND` and `REPLACE`.

Record keys are built inside Lua from `keys.record_prefix(tenant)` .. prefix hash (and
`keys.REFS_SUFFIX` for the set of conversations pointing at a record), passed in as ARGV, so
the formats still come only from shared/keys.py. Every key a script touches carries the
tenant's hash tag, so the scripts stay single-slot under Redis Cluster.

A write is one script: messages, their prefix chain, the running token tally
(shared/store/tally.py) and the metadata change together or not at all. `APPEND` extends the
chain itself from whatever the tip is when it runs (`shared.hashing.chain_step`, in Lua), so
an append that may land anywhere never has to race other writers for the tip.
"""

from __future__ import annotations

from shared.hashing import HEX_DIGITS, VERSION

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
local function push_list(key, list)
  local i = 1
  while i <= #list do
    local j = math.min(i + 999, #list)
    redis.call('RPUSH', key, unpack(list, i, j))
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

# Metadata of every write: timestamps, model ('' keeps it) and `bound` ('1': the next append
# must be checked against the exact tip, see shared/store/appends.py).
META = """
local function set_meta(now, model, bound)
  redis.call('HSETNX', KEYS[3], 'created_at', now)
  redis.call('HSET', KEYS[3], 'updated_at', now, 'bound', bound)
  if model ~= '' then redis.call('HSET', KEYS[3], 'model', model) end
end
"""

# `shared.hashing.chain_step`: the same definition, on the same strings.
CHAIN = f"""
local function chain_step(previous, digest)
  return '{VERSION}:' .. string.sub(redis.sha1hex(previous .. digest), 1, {HEX_DIGITS})
end
"""

# The tally (KEYS[5] list, KEYS[6] info) read at a position, and the best summary record within
# `upto_max` whose prefix still matches the stored chain (as `records.BEST` in 'stored' mode).
MEASURE = """
local function cum(p)
  if p <= 0 then return 0 end
  return tonumber(redis.call('LINDEX', KEYS[5], p - 1) or 0)
end
local function best_within(upto_max, prefix)
  local entries = redis.call('ZREVRANGEBYSCORE', KEYS[4], upto_max, 1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    local member, u = entries[i], tonumber(entries[i + 1])
    if redis.call('LINDEX', KEYS[2], u - 1) == member then
      local found = redis.call('GET', prefix .. member)
      if found then return found, u end
    end
  end
  return false, 0
end
local function measured(upto_max, prefix)
  local record, upto = best_within(upto_max, prefix)
  local head = tonumber(redis.call('HGET', KEYS[6], 'head_end') or 0)
  return record, cum(upto), cum(head)
end
"""

# KEYS: msgs, hashes, meta, index, tally, tally info.
# ARGV: [1] expected length ('' any), [2] expected tip hash ('' any), [3] 'free' to refuse a
# bound tip, [4] ttl ms, [5] now, [6] model, [7] record prefix, [8] refs suffix, [9] tally
# counter id ('' drops the tally), [10] bound after, [11] head end after ('' unchanged),
# [12] upto max to measure at ('' none), [13] the length the caller viewed, [14] the empty
# chain's hash, [15] n, then n messages, n digests and n base token counts.
# Refused: {0, reason, length, tip}. Done: {1, old length, old tip, length, tip, tally total
# (-1 if the tally was dropped), record JSON or false, tally at its upto, tally at the head};
# the last three only when the append landed at the viewed length, else {false, 0, 0}.
APPEND = (
    PUSH
    + TOUCH
    + META
    + CHAIN
    + MEASURE
    + """
local len = redis.call('LLEN', KEYS[1])
local last = redis.call('LINDEX', KEYS[2], -1) or ARGV[14]
if ARGV[1] ~= '' and len ~= tonumber(ARGV[1]) then return {0, 'length', len, last} end
if ARGV[2] ~= '' and last ~= ARGV[2] then return {0, 'tip', len, last} end
if ARGV[3] == 'free' and redis.call('HGET', KEYS[3], 'bound') ~= '0' then
  return {0, 'bound', len, last}
end
local n = tonumber(ARGV[15])
local chain, tip = {}, last
for i = 1, n do
  tip = chain_step(tip, ARGV[15 + n + i])
  chain[i] = tip
end
push(KEYS[1], 16, 15 + n)
push_list(KEYS[2], chain)
set_meta(ARGV[5], ARGV[6], ARGV[10])
local info = redis.call('HMGET', KEYS[6], 'counter', 'hash')
local current = ARGV[9] ~= '' and redis.call('LLEN', KEYS[5]) == len
if info[1] then
  current = current and info[1] == ARGV[9] and info[2] == last
else
  current = current and len == 0
end
local total = -1
if current then
  total = 0
  if len > 0 then total = tonumber(redis.call('LINDEX', KEYS[5], -1)) end
  local sums = {}
  for i = 1, n do
    total = total + tonumber(ARGV[15 + 2 * n + i])
    sums[i] = string.format('%d', total)
  end
  push_list(KEYS[5], sums)
  redis.call('HSET', KEYS[6], 'counter', ARGV[9], 'hash', tip)
  if ARGV[11] ~= '' then redis.call('HSET', KEYS[6], 'head_end', ARGV[11]) end
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
  redis.call('PEXPIRE', KEYS[6], ARGV[4])
else
  redis.call('DEL', KEYS[5], KEYS[6])
end
touch(ARGV[4], ARGV[7], ARGV[8])
if total < 0 or ARGV[12] == '' or len ~= tonumber(ARGV[13]) then
  return {1, len, last, len + n, tip, total, false, 0, 0}
end
local record, at_upto, at_head = measured(ARGV[12], ARGV[7])
return {1, len, last, len + n, tip, total, record, at_upto, at_head}
"""
)

# KEYS as APPEND. ARGV: [1] expected length ('' any), [2] conversation id, [3] ttl ms, [4] now,
# [5] model, [6] record prefix, [7] refs suffix, [8] tally counter id ('' none), [9] bound,
# [10] head end, [11] upto max to measure at ('' none), [12] the tip hash, [13] n, then n
# messages, n prefix hashes and n cumulative base token counts. Index entries whose prefix
# no longer matches the new content are unlinked.
# Refused: {0, length}. Done: {1, length, record JSON or false, tally at its upto, at the head}.
REPLACE = (
    PUSH
    + UNLINK
    + TOUCH
    + META
    + MEASURE
    + """
local len = redis.call('LLEN', KEYS[1])
if ARGV[1] ~= '' and len ~= tonumber(ARGV[1]) then return {0, len} end
local n = tonumber(ARGV[13])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[5], KEYS[6])
push(KEYS[1], 14, 13 + n)
push(KEYS[2], 14 + n, 13 + 2 * n)
local entries = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do
  local upto = tonumber(entries[i + 1])
  if redis.call('LINDEX', KEYS[2], upto - 1) ~= entries[i] then
    unlink(KEYS[4], ARGV[2], ARGV[6], ARGV[7], entries[i])
  end
end
set_meta(ARGV[4], ARGV[5], ARGV[9])
touch(ARGV[3], ARGV[6], ARGV[7])
if ARGV[8] == '' then return {1, n, false, 0, 0} end
push(KEYS[5], 14 + 2 * n, 13 + 3 * n)
redis.call('HSET', KEYS[6], 'counter', ARGV[8], 'hash', ARGV[12], 'head_end', ARGV[10])
redis.call('PEXPIRE', KEYS[5], ARGV[3])
redis.call('PEXPIRE', KEYS[6], ARGV[3])
if ARGV[11] == '' then return {1, n, false, 0, 0} end
local record, at_upto, at_head = measured(ARGV[11], ARGV[6])
return {1, n, record, at_upto, at_head}
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
