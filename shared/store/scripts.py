"""Lua for writing conversations: the shared parts, `APPEND`, `REPLACE` and `DELETE`.

The Lua the conversation and record scripts share, and the scripts that write a
conversation.

Record keys are built inside Lua from `keys.record_prefix(tenant, conv_id)` .. prefix hash,
passed in as ARGV, so the formats still come only from shared/store/keys.py. Every key a script
touches carries the conversation's hash tag, so the scripts stay single-slot under Redis
Cluster. The tenant's directory of record copies (shared/store/directory.py) is in another
slot: the scripts that drop records return their prefix hashes, and the caller updates the
directory in a second step.

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

# Drop one of the conversation's records and its index entry.
UNLINK = """
local function unlink(index, prefix, member)
  redis.call('ZREM', index, member)
  redis.call('DEL', prefix .. member)
end
"""

# Refresh the retention of everything holding the conversation's text, its records included.
TOUCH = """
local function touch(ttl, prefix)
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
  for _, member in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
    redis.call('PEXPIRE', prefix .. member, ttl)
  end
end
"""

# Metadata of every write: timestamps, model ('' keeps it) and `bound` ('1': the next append
# must be checked against the exact tip, see shared/store/writes.py).
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
# bound tip, [4] ttl ms, [5] now, [6] model, [7] record prefix, [8] tally counter id ('' drops
# the tally), [9] bound after, [10] head end after ('' unchanged), [11] upto max to measure at
# ('' none), [12] the length the caller viewed, [13] the empty chain's hash, [14] n, then n
# messages, n digests and n base token counts.
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
local last = redis.call('LINDEX', KEYS[2], -1) or ARGV[13]
if ARGV[1] ~= '' and len ~= tonumber(ARGV[1]) then return {0, 'length', len, last} end
if ARGV[2] ~= '' and last ~= ARGV[2] then return {0, 'tip', len, last} end
if ARGV[3] == 'free' and redis.call('HGET', KEYS[3], 'bound') ~= '0' then
  return {0, 'bound', len, last}
end
local n = tonumber(ARGV[14])
local chain, tip = {}, last
for i = 1, n do
  tip = chain_step(tip, ARGV[14 + n + i])
  chain[i] = tip
end
push(KEYS[1], 15, 14 + n)
push_list(KEYS[2], chain)
set_meta(ARGV[5], ARGV[6], ARGV[9])
local info = redis.call('HMGET', KEYS[6], 'counter', 'hash')
local current = ARGV[8] ~= '' and redis.call('LLEN', KEYS[5]) == len
if info[1] then
  current = current and info[1] == ARGV[8] and info[2] == last
else
  current = current and len == 0
end
local total = -1
if current then
  total = 0
  if len > 0 then total = tonumber(redis.call('LINDEX', KEYS[5], -1)) end
  local sums = {}
  for i = 1, n do
    total = total + tonumber(ARGV[14 + 2 * n + i])
    sums[i] = string.format('%d', total)
  end
  push_list(KEYS[5], sums)
  redis.call('HSET', KEYS[6], 'counter', ARGV[8], 'hash', tip)
  if ARGV[10] ~= '' then redis.call('HSET', KEYS[6], 'head_end', ARGV[10]) end
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
  redis.call('PEXPIRE', KEYS[6], ARGV[4])
else
  redis.call('DEL', KEYS[5], KEYS[6])
end
touch(ARGV[4], ARGV[7])
if total < 0 or ARGV[11] == '' or len ~= tonumber(ARGV[12]) then
  return {1, len, last, len + n, tip, total, false, 0, 0}
end
local record, at_upto, at_head = measured(ARGV[11], ARGV[7])
return {1, len, last, len + n, tip, total, record, at_upto, at_head}
"""
)

# KEYS as APPEND, then optionally the summary block and its count. ARGV: [1] expected length
# ('' any), [2] ttl ms, [3] now, [4] model, [5] record prefix, [6] tally counter id ('' none),
# [7] bound, [8] head end, [9] upto max to measure at ('' none), [10] the tip hash, [11] n,
# then n messages, n prefix hashes and n cumulative base token counts. Records whose prefix no
# longer matches the new content are dropped, and a block whose range's prefix it no longer
# holds is lifted.
# Refused: {0, length}. Done: {1, length, record JSON or false, tally at its upto, at the head,
# the prefix hashes of the records dropped}.
REPLACE = (
    PUSH
    + UNLINK
    + TOUCH
    + META
    + MEASURE
    + """
local len = redis.call('LLEN', KEYS[1])
if ARGV[1] ~= '' and len ~= tonumber(ARGV[1]) then return {0, len} end
local n = tonumber(ARGV[11])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[5], KEYS[6])
push(KEYS[1], 12, 11 + n)
push(KEYS[2], 12 + n, 11 + 2 * n)
local dropped = {}
local entries = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do
  local upto = tonumber(entries[i + 1])
  if redis.call('LINDEX', KEYS[2], upto - 1) ~= entries[i] then
    unlink(KEYS[4], ARGV[5], entries[i])
    dropped[#dropped + 1] = entries[i]
  end
end
if KEYS[7] then
  local cut = redis.call('HMGET', KEYS[7], 'upto', 'prefix_hash')
  if cut[1] and redis.call('LINDEX', KEYS[2], tonumber(cut[1]) - 1) ~= cut[2] then
    redis.call('DEL', KEYS[7], KEYS[8])
  end
end
set_meta(ARGV[3], ARGV[4], ARGV[7])
touch(ARGV[2], ARGV[5])
if ARGV[6] == '' then return {1, n, false, 0, 0, dropped} end
push(KEYS[5], 12 + 2 * n, 11 + 3 * n)
redis.call('HSET', KEYS[6], 'counter', ARGV[6], 'hash', ARGV[10], 'head_end', ARGV[8])
redis.call('PEXPIRE', KEYS[5], ARGV[2])
redis.call('PEXPIRE', KEYS[6], ARGV[2])
if ARGV[9] == '' then return {1, n, false, 0, 0, dropped} end
local record, at_upto, at_head = measured(ARGV[9], ARGV[5])
return {1, n, record, at_upto, at_head, dropped}
"""
)

# KEYS: msgs, hashes, meta, index, then any other per-conversation keys to drop.
# ARGV: record prefix, then optionally the pending-job marker index (also among KEYS) whose
# markers go too. -> {existed (0/1), the prefix hashes of the records dropped}.
DELETE = """
local existed = redis.call('EXISTS', KEYS[3])
local dropped = redis.call('ZRANGE', KEYS[4], 0, -1)
for _, member in ipairs(dropped) do redis.call('DEL', ARGV[1] .. member) end
if ARGV[2] then
  for _, marker in ipairs(redis.call('SMEMBERS', ARGV[2])) do redis.call('DEL', marker) end
end
redis.call('DEL', unpack(KEYS))
return {existed, dropped}
"""
