"""The Lua scripts that write entries to their targets, each in one atomic step.

``APPLY_STAGE`` (exactly-once, on the driver): if the unit's stage still exists,
write every entry (in the layout the arguments give: the one the stage was written in),
delete the stage and the unit's layout record, drop the unit from the sink's unit set,
record the unit in the sink's ``applied`` hash and move the sink's applied
watermark up to the batch, all in one script, so Redis (and its AOF) sees either
all of it or none. A stage that is gone was applied before when ``applied``
names the unit (``{-1, 0, 0}``); otherwise it is missing (``{-2, 0, 0}``), which the
protocol reports as an error instead of counting it as done.

``DECIDE`` and ``ROLLBACK_UNDECIDED`` (on the driver, and the latter in tasks) make
the decision and any rollback of the batch's units exclusive: a script runs alone,
so the decision records only units whose stages exist, and a rollback happens
only while the batch has no decision.

``APPLY_ENTRIES`` (at-least-once, in tasks): the same writes from the script's
arguments, with no stage and no bookkeeping.

In mode ``changes`` (upsert with deletes) each entry starts with an op: ``d``
deletes the key (a string, or the whole hash), ``u`` writes it as upsert does. A
delete of a key that does not exist changes nothing and is counted: both apply
scripts return ``{applied, failed, absent}``, ``absent`` being those deletes.

A write Redis refuses for the entry itself (``WRONGTYPE``: ``INCRBY`` on a key holding
text, ``HSET`` on a string; ``ERR``: a value that is no number) must not stop the
script half-way, because Redis does not roll back a script's earlier writes: it is
recorded in the sink's ``rejected`` list (unit, key, error) and the script goes on.
The driver logs how many were rejected and where.

Any other refusal is the server's state, not the entry's, and fails the script whole
(``error()``): a Redis out of memory (``OOM``: ``maxmemory`` with ``noeviction``), a
read-only replica (``READONLY``). Out of memory, Redis refuses a script's writes until
its first write succeeds, so the first entry's refusal stops the script before it wrote
anything: a unit stays staged and its replay applies it whole, and an at-least-once task
fails and is retried (``tests/services/test_frozen_store.py``). Counted as rejected
instead, every entry would have been lost: an applied unit whose entries were all
refused, or an at-least-once task that succeeded with nothing written.
"""

from __future__ import annotations

#: Batch ids (and txnVersions, up to 2**63 - 1) are compared and stored as the decimal
#: text the driver sends: a Lua number is a double, exact only below 2**53, and one
#: written back with SET becomes text such as "1.7641584e+18", which no later run reads
#: as a batch id. ``after(a, b)``: whether batch text ``a`` comes after ``b`` ("-1": none).
AFTER = """
local function after(a, b)
  if b == '-1' then return true end
  if #a ~= #b then return #a > #b end
  return a > b
end
"""

_WRITE = """
local mode, number, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local nfields = tonumber(ARGV[4])
local fields = {}
for f = 1, nfields do fields[f] = ARGV[4 + f] end
local first_entry = 5 + nfields
local changes = mode == 'changes'
local lead = changes and 1 or 0
local stride = 1 + lead + math.max(1, nfields)
local increment = mode == 'increment'
local incr = number == 'float' and 'INCRBYFLOAT' or 'INCRBY'
local hincr = number == 'float' and 'HINCRBYFLOAT' or 'HINCRBY'
local applied, failed, absent = 0, 0, 0

local function failed_write(result)
  if type(result) ~= 'table' or result.err == nil then return false end
  local code = string.match(result.err, '^(%S+)')
  if code ~= 'WRONGTYPE' and code ~= 'ERR' then error(result) end
  return true
end

local function write_one(items, i)
  if changes then
    if items[i] == 'd' then return redis.pcall('DEL', items[i + 1]) end
    i = i + 1
  end
  local key = items[i]
  if nfields == 0 then
    if increment then return redis.pcall(incr, key, items[i + 1]) end
    if ttl > 0 then return redis.pcall('SET', key, items[i + 1], 'EX', ttl) end
    return redis.pcall('SET', key, items[i + 1])
  end
  if increment then
    local result
    for f = 1, nfields do
      result = redis.pcall(hincr, key, fields[f], items[i + f])
      if failed_write(result) then return result end
    end
    return result
  end
  local args = {}
  for f = 1, nfields do
    args[2 * f - 1] = fields[f]
    args[2 * f] = items[i + f]
  end
  return redis.pcall('HSET', key, unpack(args))
end

local function write_all(items, from, rejected, unit)
  for i = from, #items, stride do
    local result = write_one(items, i)
    local key = items[i + lead]
    if failed_write(result) then
      failed = failed + 1
      if rejected then
        redis.call('RPUSH', rejected, unit .. ' ' .. key .. ' ' .. result.err)
      end
    else
      applied = applied + 1
      local deleted = changes and items[i] == 'd'
      if deleted and result == 0 then absent = absent + 1 end
      if ttl > 0 and not deleted and (increment or nfields > 0) then
        redis.call('EXPIRE', key, ttl)
      end
    end
  end
end
"""

#: KEYS: stage, units, watermark, rejected, applied.
#: ARGV: mode, number, ttl, nfields, fields..., unit, batch.
APPLY_STAGE = (
    AFTER
    + _WRITE
    + """
local stage, units, watermark, rejected = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local applied_units, layouts = KEYS[5], KEYS[6]
local unit, batch = ARGV[first_entry], ARGV[first_entry + 1]
if redis.call('EXISTS', stage) == 0 then
  redis.call('SREM', units, unit)
  redis.call('HDEL', layouts, unit)
  if redis.call('HEXISTS', applied_units, unit) == 1 then return {-1, 0, 0} end
  return {-2, 0, 0}
end
local total = redis.call('LLEN', stage)
local chunk = stride * 2000
for start = 0, total - 1, chunk do
  write_all(redis.call('LRANGE', stage, start, start + chunk - 1), 1, rejected, unit)
end
redis.call('DEL', stage)
redis.call('SREM', units, unit)
redis.call('HDEL', layouts, unit)
redis.call('HSET', applied_units, unit, batch)
if after(batch, redis.call('GET', watermark) or '-1') then redis.call('SET', watermark, batch) end
return {applied, failed, absent}
"""
)

#: KEYS: none. ARGV: mode, number, ttl, nfields, fields..., then the entries.
APPLY_ENTRIES = (
    _WRITE
    + """
write_all(ARGV, first_entry, nil, nil)
return {applied, failed, absent}
"""
)

#: KEYS: decisions, units, owner, then each unit's stage. ARGV: batch, decision text, query
#: id, unit names. Returns {0, existing decision} when the batch was decided, {1, text} when
#: this call recorded it, {-1, missing unit names...} when a named unit has no stage, {-2}
#: when the query no longer owns the sink id (``eos sinks reset`` ran meanwhile). A
#: decision stamps the owner's ``active_at`` with the server's clock.
DECIDE = """
local decisions, units, owner = KEYS[1], KEYS[2], KEYS[3]
local batch, text, query = ARGV[1], ARGV[2], ARGV[3]
local existing = redis.call('HGET', decisions, batch)
if existing then return {0, existing} end
if redis.call('HGET', owner, 'query') ~= query then return {-2} end
local missing = {-1}
for i = 4, #ARGV do
  if redis.call('SISMEMBER', units, ARGV[i]) == 0 or redis.call('EXISTS', KEYS[i]) == 0 then
    missing[#missing + 1] = ARGV[i]
  end
end
if #missing > 1 then return missing end
redis.call('HSET', decisions, batch, text)
redis.call('HSET', owner, 'active_at', redis.call('TIME')[1])
return {1, text}
"""

#: KEYS: owner, decisions, units, then every other key of the sink. ARGV: the query the
#: sink must belong to ("" for any), the last batch it may have decided ("" for any), the
#: seconds it must have been idle. Deletes every key and returns {0} when all holds, else
#: deletes nothing and returns {1, owner query, last decided batch, units in doubt, idle
#: seconds} ("" for what is unknown): ``eos sinks reset``, atomic with DECIDE.
RESET = (
    AFTER
    + """
local owner, decisions, units = KEYS[1], KEYS[2], KEYS[3]
local query = redis.call('HGET', owner, 'query') or ''
local last = ''
for _, batch in ipairs(redis.call('HKEYS', decisions)) do
  if last == '' or after(batch, last) then last = batch end
end
local doubt = redis.call('SCARD', units)
local idle = ''
local active = redis.call('HGET', owner, 'active_at')
if active then idle = tostring(tonumber(redis.call('TIME')[1]) - tonumber(active)) end
local ok = doubt == 0
if ARGV[1] ~= '' and query ~= '' and query ~= ARGV[1] then ok = false end
if ARGV[2] ~= '' and last ~= '' and after(last, ARGV[2]) then ok = false end
if idle ~= '' and tonumber(idle) < tonumber(ARGV[3]) then ok = false end
if not ok then return {1, query, last, doubt, idle} end
redis.call('DEL', unpack(KEYS))
return {0}
"""
)

#: KEYS: decisions, units, then each unit's stage. ARGV: batch, unit names.
#: Returns 0 (nothing done) when the batch is decided, 1 when the units were discarded.
ROLLBACK_UNDECIDED = """
local decisions, units = KEYS[1], KEYS[2]
if redis.call('HEXISTS', decisions, ARGV[1]) == 1 then return 0 end
for i = 2, #ARGV do
  redis.call('DEL', KEYS[i + 1])
  redis.call('SREM', units, ARGV[i])
end
return 1
"""

#: KEYS: the sink's owner hash. ARGV: query id, origin, target, write settings (JSON).
#: Records the owner unless one is recorded; returns {query id, origin} of the owner.
CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'query', ARGV[1], 'origin', ARGV[2], 'target', ARGV[3],
             'writes', ARGV[4])
end
return redis.call('HMGET', KEYS[1], 'query', 'origin')
"""

#: Exactly-once, in tasks: claim the keys of the unit's stage for its partition (one
#: key, one task of a batch; see :mod:`eos_connectors.core.changes`), atomically with
#: every other task's claims. A claim of an earlier run of the query is replaced.
#: A refused unit is dropped in the same script (its stage, its name in the unit set).
#: KEYS: stage, claims, units. ARGV: run, partition, stride, lead (1 when an op leads),
#: unit. Returns {} or {key, the other partition}.
CLAIM_KEYS = """
local stage, claims, units = KEYS[1], KEYS[2], KEYS[3]
local run, stride, lead = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local mine = run .. ':' .. ARGV[2]
local this_run = run .. ':'
local total = redis.call('LLEN', stage)
local chunk = stride * 2000
for start = 0, total - 1, chunk do
  local items = redis.call('LRANGE', stage, start, start + chunk - 1)
  for i = 1 + lead, #items, stride do
    local key = items[i]
    local held = redis.call('HGET', claims, key)
    if held ~= mine then
      if held and string.sub(held, 1, #this_run) == this_run then
        redis.call('DEL', stage)
        redis.call('SREM', units, ARGV[5])
        return {key, string.sub(held, #this_run + 1)}
      end
      redis.call('HSET', claims, key, mine)
    end
  end
end
redis.call('EXPIRE', claims, 604800)
return {}
"""
