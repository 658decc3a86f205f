-- taskkit Redis broker: every multi-key step, one Lua script each (see brokers/redis.py).
--
-- This file is a shared prelude followed by sections that start with a line
-- "--!script NAME". brokers/redis.py sends each script as prelude + section, loads it once
-- (SCRIPT LOAD) and calls it by SHA (EVALSHA, reloading on NOSCRIPT).
--
-- Every script works on ONE queue (or one flow-control key, see the end) and touches only the
-- keys passed in KEYS. All of them share one hash tag, so a script never crosses a Redis Cluster
-- slot. For queue scripts KEYS[1..19] are always the queue's keys, in this order (P = prefix,
-- Q = queue name):
--
--   1 paused     P:{Q}:paused      string  "1" while the queue is paused
--   2 ready      P:{Q}:ready       list    the inbox that BLMOVE waits on. Producers LPUSH, workers
--                                          take from the right (FIFO). An element of exactly 32
--                                          lowercase hex characters is a wake hint (the id of a job
--                                          that is already queued, or 32 zeros); anything else is a
--                                          raw payload from a foreign producer, adopted on sight
--   3 workers    P:{Q}:workers     zset    broker instance id -> last `now` it claimed here
--   4 queued     P:{Q}:queued      zset    due pending jobs: score -priority, member
--                                          "%020.6f(run_at)|%016d(seq)|<id>", so ZRANGE 0 n-1 gives
--                                          highest priority, then earliest run_at, then FIFO
--   5 scheduled  P:{Q}:scheduled   zset    pending jobs not yet due: score run_at, member id
--   6 leases     P:{Q}:leases      zset    running jobs: score lease_until, member id
--   7 tokens     P:{Q}:tokens      hash    id -> lease token (present exactly while running)
--   8 attempts   P:{Q}:attempts    hash    id -> attempts charged (absent = 0)
--   9 payloads   P:{Q}:payloads    hash    id -> the payload, byte for byte as it arrived
--  10 meta       P:{Q}:meta        hash    id -> JSON object of strings: st (pending|dead),
--                                          pr priority, ra run_at, sq seq, ea enqueued_at,
--                                          fa finished_at, ma max_attempts, dk dedupe key,
--                                          le last error
--  11 dead       P:{Q}:dead        zset    dead jobs: score finished_at, member id
--  12 dedupe     P:{Q}:dedupe      hash    dedupe key -> id of the pending/running job holding it
--  13 seq        P:{Q}:seq         string  counter: FIFO order among equal run times
--  14 rawids     P:{Q}:rawids      hash    payload -> space-separated ids that enqueue_raw promised
--                                          for that payload, handed out when it is adopted
--  15 started    P:{Q}:started     hash    id -> when its latest attempt was claimed
--  16 progress   P:{Q}:progress    hash    id -> JSON progress of its latest attempt
--  17 alerts     P:{Q}:alerts      hash    alert key -> JSON object of strings, the alert outbox
--                                          row of a key whose events name Q: kd kind, tk task,
--                                          jb job id, dt detail, c count, fa first_at, la last_at,
--                                          na next_at, at attempts, le last error, sa sent_at,
--                                          tok claim token. No TTL: one row per key, so bounded
--  18 alertdue   P:{Q}:alertdue    zset    the pending rows (c > 0): score next_at, member key
--  19 rawsince   P:{Q}:rawsince    string  when the inbox was first seen holding a raw payload;
--                                          deleted by the claim that empties the inbox. The only
--                                          date stats has for payloads not yet adopted
--
-- Keys after 19 are per script: P:{Q}:processing:<broker id> (the list BLMOVE moves into) or
-- P:{Q}:done:<id>, a finished job kept until its keep_until (completed with a kept result, or
-- cancelled): a hash with meta, payload, attempts, keep_until, result, started_at, progress,
-- and a real TTL.
--
-- Times (ARGV) are the caller's clock as decimal strings; scripts never read Redis TIME.

local unpack = unpack or table.unpack

local K_PAUSED, K_READY, K_WORKERS, K_QUEUED, K_SCHEDULED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_LEASES, K_TOKENS, K_ATTEMPTS, K_PAYLOADS, K_META = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local K_DEAD, K_DEDUPE, K_SEQ, K_RAWIDS = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local K_STARTED, K_PROGRESS, K_ALERTS, K_ALERTDUE, K_RAWSINCE = KEYS[15], KEYS[16], KEYS[17], KEYS[18], KEYS[19]
local NK = 19            -- the first per-script key is KEYS[NK + 1]

local WAKE = "00000000000000000000000000000000"
local MAX_HINTS = 64     -- wake hints pushed per call: enough to wake every waiting worker
local ID_AT = 39         -- where the id starts in a queued member
local RA_LEN = 20        -- a queued member starts with its run_at, this many characters

local function is_hint(e)
  return #e == 32 and not string.find(e, "[^0-9a-f]")
end

local function hint_for(id)
  if is_hint(id) then return id end
  return WAKE
end

local function member(ra, seq, id)
  local t = tonumber(ra) or 0
  if t < 0 then t = 0 elseif t > 9999999999999 then t = 9999999999999 end
  return string.format("%020.6f|%016d|", t, seq) .. id
end

-- Put a pending job where it waits: queued when due at `now`, else scheduled. True when due.
local function place(id, m, now)
  local ra = tonumber(m.ra)
  if ra <= now then
    redis.call("ZADD", K_QUEUED, -tonumber(m.pr), member(m.ra, tonumber(m.sq), id))
    return true
  end
  redis.call("ZADD", K_SCHEDULED, m.ra, id)
  return false
end

local function push_hints(hints)
  if #hints > 0 then redis.call("LPUSH", K_READY, unpack(hints)) end
end

local function id_maker(base)
  local n = 0
  return function()
    n = n + 1
    return string.sub(base, 1, 24) .. string.format("%08x", n)
  end
end

-- The id for an adopted raw payload: the one enqueue_raw promised for it, else a fresh one.
local function raw_id(payload, new_id)
  local ids = redis.call("HGET", K_RAWIDS, payload)
  if ids then
    local first, rest = string.match(ids, "^(%S+)%s*(.*)$")
    if rest == "" then
      redis.call("HDEL", K_RAWIDS, payload)
    else
      redis.call("HSET", K_RAWIDS, payload, rest)
    end
    return first
  end
  return new_id()
end

local function store_raw(id, payload, now_s)
  local seq = redis.call("INCR", K_SEQ)
  local m = {st = "pending", pr = "0", ra = now_s, ea = now_s, sq = tostring(seq)}
  redis.call("HSET", K_PAYLOADS, id, payload)
  redis.call("HSET", K_META, id, cjson.encode(m))
  redis.call("ZADD", K_QUEUED, 0, member(now_s, seq, id))
end

-- An inbox element: a hint is dropped (its job is already queued), a raw payload becomes a job.
-- Returns 1 when a job was adopted.
local function adopt(e, now_s, new_id)
  if is_hint(e) then return 0 end
  store_raw(raw_id(e, new_id), e, now_s)
  return 1
end

-- Adopt everything in one processing list (oldest first) and delete it.
local function adopt_list(key, now_s, new_id)
  local moved = redis.call("LRANGE", key, 0, -1)
  local n = 0
  if #moved > 0 then
    redis.call("DEL", key)
    for i = #moved, 1, -1 do n = n + adopt(moved[i], now_s, new_id) end
  end
  return n
end

-- Lease `ids` (whose payloads are `payloads`, false for a vanished job) to fresh tokens until
-- lease_until, started at now_s, progress cleared; `charge` adds an attempt. Returns the
-- deliveries as one framed string, per job "<#id> <#payload> <attempts> <token>\n<id><payload>"
-- (cheap for the client to parse). Attempts are read with one HMGET and written with one HSET
-- rather than a HINCRBY per job: a redis.call costs more than the rest of a job's lease.
local function lease_out(ids, payloads, tok, lease_until, charge, now_s)
  local live, bodies = {}, {}
  for i, id in ipairs(ids) do
    if payloads[i] then
      live[#live + 1] = id
      bodies[#bodies + 1] = payloads[i]
    end
  end
  if #live == 0 then return "" end
  local before = redis.call("HMGET", K_ATTEMPTS, unpack(live))
  local tokens, leases, started, charged, frames = {}, {}, {}, {}, {}
  for i, id in ipairs(live) do
    local attempts = tonumber(before[i]) or 0
    if charge then
      attempts = attempts + 1
      charged[#charged + 1] = id
      charged[#charged + 1] = attempts
    end
    local token = tok .. string.format("%x", i)
    tokens[#tokens + 1] = id
    tokens[#tokens + 1] = token
    leases[#leases + 1] = lease_until
    leases[#leases + 1] = id
    started[#started + 1] = id
    started[#started + 1] = now_s
    local payload = bodies[i]
    frames[i] = #id .. " " .. #payload .. " " .. string.format("%d", attempts) .. " " .. token .. "\n" .. id .. payload
  end
  if charge then redis.call("HSET", K_ATTEMPTS, unpack(charged)) end
  redis.call("HSET", K_TOKENS, unpack(tokens))
  redis.call("ZADD", K_LEASES, unpack(leases))
  redis.call("HSET", K_STARTED, unpack(started))
  redis.call("HDEL", K_PROGRESS, unpack(live)) -- each attempt starts without progress
  return table.concat(frames)
end

local function owned(id, token)
  return redis.call("HGET", K_TOKENS, id) == token
end

local function end_lease(id)
  redis.call("HDEL", K_TOKENS, id)
  redis.call("ZREM", K_LEASES, id)
end

local function free_dedupe(id, m)
  if m.dk and redis.call("HGET", K_DEDUPE, m.dk) == id then
    redis.call("HDEL", K_DEDUPE, m.dk)
  end
end

local FORGET = {K_PAYLOADS, K_META, K_ATTEMPTS, K_STARTED, K_PROGRESS}

-- Delete every field a job has in the queue's hashes.
local function forget(ids)
  for _, key in ipairs(FORGET) do redis.call("HDEL", key, unpack(ids)) end
end

-- Keep a finished job (state st) in `done` until keep (a time string); false when keep <= now.
local function keep_done(id, m, st, done, keep, result, now, now_s)
  local ttl_ms = math.ceil((tonumber(keep) - now) * 1000)
  if ttl_ms <= 0 then return false end
  m.st, m.fa = st, now_s
  redis.call("DEL", done)
  redis.call("HSET", done, "meta", cjson.encode(m), "payload", redis.call("HGET", K_PAYLOADS, id),
    "attempts", redis.call("HGET", K_ATTEMPTS, id) or "0", "keep_until", keep)
  if result then redis.call("HSET", done, "result", result) end
  local started = redis.call("HGET", K_STARTED, id)
  if started then redis.call("HSET", done, "started_at", started) end
  local progress = redis.call("HGET", K_PROGRESS, id)
  if progress then redis.call("HSET", done, "progress", progress) end
  redis.call("PEXPIRE", done, ttl_ms)
  return true
end

local function purge_dead_id(id)
  if not redis.call("ZSCORE", K_DEAD, id) then return 0 end
  local raw = redis.call("HGET", K_META, id)
  if raw then free_dedupe(id, cjson.decode(raw)) end
  redis.call("ZREM", K_DEAD, id)
  forget({id})
  return 1
end

-- Dead-letter retention: keep at most dead_max, none older than dead_ttl seconds (0 = no limit).
-- Bounded work per call; whatever is left is trimmed by the next dead letter.
local function trim_dead(now, dead_max, dead_ttl)
  local victims = {}
  if dead_max > 0 then
    local excess = redis.call("ZCARD", K_DEAD) - dead_max
    if excess > 0 then
      victims = redis.call("ZRANGE", K_DEAD, 0, math.min(excess, 200) - 1)
    end
  end
  for _, id in ipairs(victims) do purge_dead_id(id) end
  if dead_ttl > 0 then
    local old = redis.call("ZRANGEBYSCORE", K_DEAD, "-inf", "(" .. tostring(now - dead_ttl),
      "LIMIT", 0, 200)
    for _, id in ipairs(old) do purge_dead_id(id) end
  end
end

-- Whether s is UTF-8 (no overlong forms, no encoded surrogates). cjson passes any bytes through,
-- but Python reads no task from a payload that does not decode, and an alert key that is not
-- UTF-8 could not come back from Python to finish_alert. Only non-ASCII bytes are looked at.
local function is_utf8(s)
  local i = string.find(s, "[\128-\255]")
  while i do
    local c, extra = string.byte(s, i), 0
    if c >= 0xC2 and c <= 0xDF then extra = 1
    elseif c >= 0xE0 and c <= 0xEF then extra = 2
    elseif c >= 0xF0 and c <= 0xF4 then extra = 3
    else return false end
    local lo, hi = 0x80, 0xBF
    if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F
    elseif c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
    for j = i + 1, i + extra do
      local d = string.byte(s, j)
      if not d or d < lo or d > hi then return false end
      lo, hi = 0x80, 0xBF
    end
    i = string.find(s, "[\128-\255]", i + extra + 1)
  end
  return true
end

-- The task name of a payload as taskkit.job.peek_task reads it (false when none is readable), so
-- a dead job's alert key is the same on every broker: 1-200 characters, none of them a space or
-- a control character (U+0000-U+0020, U+007F-U+009F; in UTF-8 the last are C2 80 - C2 9F).
local function peek_task(payload)
  if not is_utf8(payload) then return false end
  local ok, data = pcall(cjson.decode, payload)
  if not ok or type(data) ~= "table" then return false end
  local t = data.task
  if type(t) ~= "string" or string.find(t, "[%z\1-\32\127]") or string.find(t, "\194[\128-\159]") then
    return false
  end
  local _, chars = string.gsub(t, "[^\128-\191]", "")
  if chars < 1 or chars > 200 then return false end
  return t
end

-- Merge one event into the outbox row of `key` (Broker.record_alert). task and job_id: false =
-- none; detail is already cut to ALERT_DETAIL_LIMIT by the caller.
local function record_alert(key, kind, task, job_id, detail, now_s)
  local raw = redis.call("HGET", K_ALERTS, key)
  local a
  if raw then
    a = cjson.decode(raw)
  else
    a = {c = "0", fa = now_s, la = now_s, na = now_s, at = "0"}
  end
  if tonumber(a.c) == 0 then
    -- Delivered before: a new window starts, but not before the quiet window of the last one ends.
    a.fa = now_s
    if tonumber(a.na) < tonumber(now_s) then a.na = now_s end
  end
  a.c = string.format("%d", tonumber(a.c) + 1)
  a.la, a.kd, a.dt = now_s, kind, detail
  a.tk, a.jb = task or nil, job_id or nil
  redis.call("HSET", K_ALERTS, key, cjson.encode(a))
  redis.call("ZADD", K_ALERTDUE, a.na, key)
end

-- Flow-control keys carry a real TTL a little over what they must remember, so idle keys vanish;
-- never shorten one that another holder's longer lease set.
local function expire_at_least(key, ms)
  if redis.call("PTTL", key) < tonumber(ms) then redis.call("PEXPIRE", key, ms) end
end

--!script enqueue
-- KEYS: queue keys, then P:{Q}:done:<id> per job. ARGV: now, then 6 per job: id, payload,
-- priority, run_at ('' = now), dedupe key ('' = none), max_attempts ('' = none).
-- Returns one id per job: a held dedupe key returns its holder, a known id is not stored again.
-- The whole batch is read with one HMGET and one EXISTS and written with one command per key
-- (HSET, ZADD, HDEL, LPUSH with many values): a redis.call costs about as much as the rest of
-- a job's work, and batches of 500 would otherwise make 8 of them per job.
local now_s = ARGV[1]
local now = tonumber(now_s)
local ids = {}
for i = 2, #ARGV, 6 do ids[#ids + 1] = ARGV[i] end
local known = redis.call("HMGET", K_META, unpack(ids))
-- A kept job (done:<id>) is known too; most batches have none, so test them all at once first.
local kept = redis.call("EXISTS", unpack(KEYS, NK + 1, NK + #ids)) > 0
local out, hints, stored = {}, {}, {}
local mine, claimed = {}, {}  -- ids stored and dedupe keys taken earlier in this batch
for job, id in ipairs(ids) do
  local i = 2 + (job - 1) * 6
  local dk = ARGV[i + 4]
  local held = false
  if dk ~= "" then held = claimed[dk] or redis.call("HGET", K_DEDUPE, dk) end
  if held then
    out[job] = held
  elseif known[job] or mine[id] or (kept and redis.call("EXISTS", KEYS[NK + job]) == 1) then
    out[job] = id -- enqueue is idempotent by id
  else
    mine[id] = true
    if dk ~= "" then claimed[dk] = id end
    stored[#stored + 1] = i
    out[job] = id
  end
end
if #stored > 0 then
  local seq = redis.call("INCRBY", K_SEQ, #stored) - #stored
  local payloads, metas, queued, scheduled, fresh, dedupe = {}, {}, {}, {}, {}, {}
  for n, i in ipairs(stored) do
    local id, pr, ra, dk, ma = ARGV[i], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
    if ra == "" then ra = now_s end
    local sq = tostring(seq + n)
    -- meta by hand: every field but the dedupe key is a number the caller formatted, so only
    -- that one needs cjson's escaping (cjson.encode of a table costs more than the rest).
    local m = '{"st":"pending","pr":"' .. pr .. '","ra":"' .. ra .. '","ea":"' .. now_s
      .. '","sq":"' .. sq .. '"'
    if ma ~= "" then m = m .. ',"ma":"' .. ma .. '"' end
    if dk ~= "" then
      m = m .. ',"dk":' .. cjson.encode(dk)
      dedupe[#dedupe + 1] = dk
      dedupe[#dedupe + 1] = id
    end
    payloads[#payloads + 1] = id
    payloads[#payloads + 1] = ARGV[i + 1]
    metas[#metas + 1] = id
    metas[#metas + 1] = m .. "}"
    fresh[#fresh + 1] = id
    if tonumber(ra) <= now then
      queued[#queued + 1] = -tonumber(pr)
      queued[#queued + 1] = member(ra, seq + n, id)
      if #hints < MAX_HINTS then hints[#hints + 1] = hint_for(id) end
    else
      scheduled[#scheduled + 1] = ra
      scheduled[#scheduled + 1] = id
    end
  end
  redis.call("HSET", K_PAYLOADS, unpack(payloads))
  redis.call("HSET", K_META, unpack(metas))
  redis.call("HDEL", K_ATTEMPTS, unpack(fresh))
  if #dedupe > 0 then redis.call("HSET", K_DEDUPE, unpack(dedupe)) end
  if #queued > 0 then redis.call("ZADD", K_QUEUED, unpack(queued)) end
  if #scheduled > 0 then redis.call("ZADD", K_SCHEDULED, unpack(scheduled)) end
end
push_hints(hints)
return out

--!script push_raw
-- KEYS: queue keys. ARGV: now, payload, id. Does what a foreign producer does (LPUSH the
-- payload) and promises `id` to whoever adopts that payload. A payload that would read as a
-- wake hint is stored as a job at once instead.
local now_s, payload, id = ARGV[1], ARGV[2], ARGV[3]
if is_hint(payload) then
  store_raw(id, payload, now_s)
  redis.call("LPUSH", K_READY, hint_for(id))
  return id
end
local ids = redis.call("HGET", K_RAWIDS, payload)
if ids then ids = ids .. " " .. id else ids = id end
redis.call("HSET", K_RAWIDS, payload, ids)
redis.call("LPUSH", K_READY, payload)
redis.call("SET", K_RAWSINCE, now_s, "NX")
return id

--!script claim
-- KEYS: queue keys, 17 = this broker's processing list.
-- ARGV: now, limit, lease_until, token base, id base, broker id, inbox max, promote max.
-- Adopts what this broker's BLMOVE moved (and the inbox), promotes due scheduled jobs, then
-- claims up to `limit` jobs: attempts + 1, a fresh token, a lease. Returns
-- {paused, next scheduled run_at or '', deliveries framed as in lease_out}.
local now_s, limit, lease_until, tok = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local new_id, wid = id_maker(ARGV[5]), ARGV[6]
local inbox_max, promote_max = tonumber(ARGV[7]), tonumber(ARGV[8])
local now = tonumber(now_s)
redis.call("ZADD", K_WORKERS, now_s, wid)
local fresh = adopt_list(KEYS[NK + 1], now_s, new_id)
local inbox = redis.call("RPOP", K_READY, inbox_max)
if inbox then
  for i = 1, #inbox do fresh = fresh + adopt(inbox[i], now_s, new_id) end
end
if redis.call("LLEN", K_READY) == 0 then redis.call("DEL", K_RAWSINCE) end
local due = redis.call("ZRANGEBYSCORE", K_SCHEDULED, "-inf", now_s, "LIMIT", 0, promote_max)
for _, id in ipairs(due) do
  redis.call("ZREM", K_SCHEDULED, id)
  local raw = redis.call("HGET", K_META, id)
  if raw and place(id, cjson.decode(raw), now) then fresh = fresh + 1 end
end
local paused = redis.call("EXISTS", K_PAUSED)
local res = {paused, "", ""}
if paused == 0 and limit > 0 then
  local members = redis.call("ZRANGE", K_QUEUED, 0, limit - 1)
  if #members > 0 then
    redis.call("ZREMRANGEBYRANK", K_QUEUED, 0, #members - 1)
    local ids = {}
    for i, m in ipairs(members) do ids[i] = string.sub(m, ID_AT) end
    local payloads = redis.call("HMGET", K_PAYLOADS, unpack(ids))
    res[3] = lease_out(ids, payloads, tok, lease_until, true, now_s)
  end
end
-- Work that no hint announced (adopted or promoted) and is still queued: wake another waiter.
if fresh > 0 and redis.call("ZCARD", K_QUEUED) > 0 then redis.call("LPUSH", K_READY, WAKE) end
local nxt = redis.call("ZRANGE", K_SCHEDULED, 0, 0, "WITHSCORES")
if nxt[2] then res[2] = nxt[2] end
return res

--!script reclaim
-- KEYS: queue keys. ARGV: now, lease_until, limit, token base, stale threshold, own broker id.
-- Re-leases up to `limit` jobs whose lease ended before `now` (attempts unchanged) and names the
-- broker instances not seen since the threshold, whose processing lists need recovering.
-- Returns {n stale ids, stale ids..., then the deliveries framed as in lease_out (if any)}.
local now_s, lease_until, limit, tok = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local stale = redis.call("ZRANGEBYSCORE", K_WORKERS, "-inf", "(" .. ARGV[5], "LIMIT", 0, 20)
local res = {0}
for _, wid in ipairs(stale) do
  if wid ~= ARGV[6] then res[#res + 1] = wid end
end
res[1] = #res - 1
if limit > 0 then
  local expired = redis.call("ZRANGEBYSCORE", K_LEASES, "-inf", "(" .. now_s, "LIMIT", 0, limit)
  local ids = {}
  for _, id in ipairs(expired) do
    if redis.call("HEXISTS", K_TOKENS, id) == 1 then
      ids[#ids + 1] = id
    else
      redis.call("ZREM", K_LEASES, id) -- a lease without a running job: nothing to hand out
    end
  end
  if #ids > 0 then
    local payloads = redis.call("HMGET", K_PAYLOADS, unpack(ids))
    res[#res + 1] = lease_out(ids, payloads, tok, lease_until, false, now_s)
  end
end
return res

--!script recover
-- KEYS: queue keys, 17 = the processing list of broker `wid`. ARGV: now, wid, threshold, id base,
-- force ('1' = recover even if recently seen: the broker itself is closing).
-- A broker not seen since `threshold` died between BLMOVE and its claim: adopt what it moved.
local now_s, wid = ARGV[1], ARGV[2]
local seen = redis.call("ZSCORE", K_WORKERS, wid)
if ARGV[5] ~= "1" and seen and tonumber(seen) >= tonumber(ARGV[3]) then return -1 end
local n = adopt_list(KEYS[NK + 1], now_s, id_maker(ARGV[4]))
redis.call("ZREM", K_WORKERS, wid)
if n > 0 then redis.call("LPUSH", K_READY, WAKE) end
return n

--!script extend
-- KEYS: queue keys. ARGV: lease_until, then id, token per lease. Returns the 1-based positions
-- of the leases that were lost.
local lost = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if owned(id, ARGV[i + 1]) then
    redis.call("ZADD", K_LEASES, ARGV[1], id)
  else
    lost[#lost + 1] = i / 2
  end
end
return lost

--!script settle
-- KEYS: queue keys, then P:{Q}:done:<id> per item that keeps its result, in item order.
-- ARGV: now, dead_max, dead_ttl, queue name, then per item: id, token, op, and op's arguments:
--   C                    complete, nothing kept
--   K keep_until         complete, keep the job (no result) until keep_until
--   Kr keep_until result complete, keep the job and its result
--   R run_at, Re run_at error, with "c" appended to charge the attempt (Rc, Rec)
--   D error              dead letter, and its alert in the same step (Broker.settle)
--   Dd error detail      the same, with the alert's detail (error cut to the limit) apart
-- Returns a string with one character per item: 1 (applied) or 0 (lease lost).
local now_s = ARGV[1]
local now, dead_max, dead_ttl, queue = tonumber(now_s), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local items, ids, tokens = {}, {}, {}
local i, kept = 5, NK
while i <= #ARGV do
  local it = {id = ARGV[i], op = ARGV[i + 2]}
  ids[#ids + 1] = it.id
  tokens[#tokens + 1] = ARGV[i + 1]
  i = i + 3
  local kind = string.sub(it.op, 1, 1)
  if kind == "K" then
    kept = kept + 1
    it.done, it.keep = KEYS[kept], ARGV[i]
    i = i + 1
    if it.op == "Kr" then
      it.result = ARGV[i]
      i = i + 1
    end
  elseif kind == "R" then
    it.run_at = ARGV[i]
    i = i + 1
    if string.find(it.op, "e", 2, true) then
      it.err = ARGV[i]
      i = i + 1
    end
  elseif kind == "D" then
    it.err, it.detail = ARGV[i], ARGV[i]
    i = i + 1
    if it.op == "Dd" then
      it.detail = ARGV[i]
      i = i + 1
    end
  end
  items[#items + 1] = it
end
local held = redis.call("HMGET", K_TOKENS, unpack(ids))
local metas = redis.call("HMGET", K_META, unpack(ids))
local out, hints, ended, gone, died = {}, {}, {}, {}, false
local settled = {}
for n, it in ipairs(items) do
  local id, raw = it.id, metas[n]
  if not raw or held[n] ~= tokens[n] or settled[id] then
    out[n] = "0"
  else
    out[n] = "1"
    settled[id] = true
    ended[#ended + 1] = id
    local kind = string.sub(it.op, 1, 1)
    local m
    if kind ~= "C" or string.find(raw, '"dk"', 1, true) then m = cjson.decode(raw) end
    if kind == "C" or kind == "K" then
      if m then free_dedupe(id, m) end
      if it.keep then keep_done(id, m, "done", it.done, it.keep, it.result, now, now_s) end
      gone[#gone + 1] = id
    elseif kind == "R" then
      m.ra, m.le = it.run_at, it.err
      if not string.find(it.op, "c", 2, true) then
        local left = redis.call("HINCRBY", K_ATTEMPTS, id, -1)
        if left < 0 then redis.call("HSET", K_ATTEMPTS, id, 0) end
      end
      redis.call("HSET", K_META, id, cjson.encode(m))
      if place(id, m, now) and #hints < MAX_HINTS then hints[#hints + 1] = hint_for(id) end
    else
      free_dedupe(id, m)
      m.st, m.le, m.fa = "dead", it.err, now_s
      redis.call("HSET", K_META, id, cjson.encode(m))
      redis.call("ZADD", K_DEAD, now_s, id)
      local task = peek_task(redis.call("HGET", K_PAYLOADS, id) or "")
      record_alert("dead:" .. queue .. ":" .. (task or "?"), "dead", task, id, it.detail, now_s)
      died = true
    end
  end
end
if #ended > 0 then
  redis.call("HDEL", K_TOKENS, unpack(ended))
  redis.call("ZREM", K_LEASES, unpack(ended))
end
if #gone > 0 then forget(gone) end
push_hints(hints)
if died then trim_dead(now, dead_max, dead_ttl) end
return table.concat(out)

--!script release
-- KEYS: queue keys. ARGV: now, then id, token per lease. Owned jobs go back to pending,
-- runnable now, with the claim's attempt given back. Returns how many were released.
local now_s = ARGV[1]
local now = tonumber(now_s)
local hints, n = {}, 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  local raw = redis.call("HGET", K_META, id)
  if raw and owned(id, ARGV[i + 1]) then
    end_lease(id)
    local left = redis.call("HINCRBY", K_ATTEMPTS, id, -1)
    if left < 0 then redis.call("HSET", K_ATTEMPTS, id, 0) end
    local m = cjson.decode(raw)
    m.ra = now_s
    redis.call("HSET", K_META, id, cjson.encode(m))
    place(id, m, now)
    if #hints < MAX_HINTS then hints[#hints + 1] = hint_for(id) end
    n = n + 1
  end
end
push_hints(hints)
return n

--!script get
-- KEYS: queue keys, 17 = P:{Q}:done:<id>. ARGV: id.
-- Returns {1, meta, payload, attempts, running (0/1), started_at, progress} for a live job,
-- {2, meta, payload, attempts, keep_until, result, started_at, progress} for a kept one, or {0}.
local id = ARGV[1]
local raw = redis.call("HGET", K_META, id)
if raw then
  return {1, raw, redis.call("HGET", K_PAYLOADS, id), redis.call("HGET", K_ATTEMPTS, id) or "0",
    redis.call("HEXISTS", K_TOKENS, id), redis.call("HGET", K_STARTED, id),
    redis.call("HGET", K_PROGRESS, id)}
end
local d = redis.call("HMGET", KEYS[NK + 1], "meta", "payload", "attempts", "keep_until", "result",
  "started_at", "progress")
if d[1] then return {2, d[1], d[2], d[3], d[4], d[5], d[6], d[7]} end
return {0}

--!script cancel
-- KEYS: queue keys, 17 = P:{Q}:done:<id>. ARGV: id, keep_until, now.
-- A pending or scheduled job becomes cancelled: out of the queue, its dedupe key freed, kept in
-- the done key until keep_until. Returns the state after the call ("cancelled", "running",
-- "dead", "done"), or false when the queue has no such job.
local id, keep, now_s = ARGV[1], ARGV[2], ARGV[3]
local raw = redis.call("HGET", K_META, id)
if not raw then
  local d = redis.call("HMGET", KEYS[NK + 1], "meta", "keep_until")
  if d[1] and tonumber(d[2]) > tonumber(now_s) then return cjson.decode(d[1]).st end
  return false
end
if redis.call("HEXISTS", K_TOKENS, id) == 1 then return "running" end
local m = cjson.decode(raw)
if m.st == "dead" then return "dead" end
redis.call("ZREM", K_QUEUED, member(m.ra, tonumber(m.sq), id))
redis.call("ZREM", K_SCHEDULED, id)
free_dedupe(id, m)
keep_done(id, m, "cancelled", KEYS[NK + 1], keep, false, tonumber(now_s), now_s)
forget({id})
return "cancelled"

--!script progress
-- KEYS: queue keys. ARGV: id, token, progress. Stores progress only while the token owns the job.
if owned(ARGV[1], ARGV[2]) then
  redis.call("HSET", K_PROGRESS, ARGV[1], ARGV[3])
  return 1
end
return 0

--!script list_dead
-- KEYS: queue keys. ARGV: limit. Newest first, 7 per job: id, finished_at, meta, payload,
-- attempts, started_at, progress.
local res = {}
local ids = redis.call("ZREVRANGE", K_DEAD, 0, tonumber(ARGV[1]) - 1, "WITHSCORES")
for i = 1, #ids, 2 do
  local id = ids[i]
  local raw = redis.call("HGET", K_META, id)
  if raw then
    local n = #res
    res[n + 1] = id
    res[n + 2] = ids[i + 1]
    res[n + 3] = raw
    res[n + 4] = redis.call("HGET", K_PAYLOADS, id) or ""
    res[n + 5] = redis.call("HGET", K_ATTEMPTS, id) or "0"
    res[n + 6] = redis.call("HGET", K_STARTED, id) or ""
    res[n + 7] = redis.call("HGET", K_PROGRESS, id) or ""
  end
end
return res

--!script requeue
-- KEYS: queue keys. ARGV: now, then ids. Dead ids go back to pending, runnable now, attempts 0;
-- one whose dedupe key another active job holds meanwhile stays dead. Returns the ids requeued.
local now_s = ARGV[1]
local now = tonumber(now_s)
local out, hints = {}, {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local raw = redis.call("HGET", K_META, id)
  if raw and redis.call("ZSCORE", K_DEAD, id) then
    local m = cjson.decode(raw)
    if not (m.dk and redis.call("HEXISTS", K_DEDUPE, m.dk) == 1) then
      if m.dk then redis.call("HSET", K_DEDUPE, m.dk, id) end
      m.st, m.ra, m.fa = "pending", now_s, nil
      redis.call("HSET", K_META, id, cjson.encode(m))
      redis.call("HSET", K_ATTEMPTS, id, 0)
      redis.call("ZREM", K_DEAD, id)
      place(id, m, now)
      if #hints < MAX_HINTS then hints[#hints + 1] = hint_for(id) end
      out[#out + 1] = id
    end
  end
end
push_hints(hints)
return out

--!script purge
-- KEYS: queue keys. ARGV: ids. Deletes those that are dead; returns how many.
local n = 0
for i = 1, #ARGV do n = n + purge_dead_id(ARGV[i]) end
return n

--!script stats
-- KEYS: queue keys. ARGV: now, how many inbox elements to inspect.
-- Returns {ready, scheduled, running, dead, paused, oldest_ready_at or ''}; ready counts raw
-- payloads still in the inbox, dated by rawsince (set here when no one dated them yet).
local now_s = ARGV[1]
local now = tonumber(now_s)
local raw = 0
local inbox = redis.call("LRANGE", K_READY, -tonumber(ARGV[2]), -1)
for _, e in ipairs(inbox) do
  if not is_hint(e) then raw = raw + 1 end
end
local oldest = ""
local function older(t)
  if t and (oldest == "" or tonumber(t) < tonumber(oldest)) then oldest = t end
end
-- queued is ordered by priority first: the earliest run_at is the head of one of its priority
-- groups. Few priorities are in use; past MAX_GROUPS the answer is the best of those seen.
local MAX_GROUPS = 100
local head = redis.call("ZRANGE", K_QUEUED, 0, 0, "WITHSCORES")
for _ = 1, MAX_GROUPS do
  if not head[1] then break end
  older(string.sub(head[1], 1, RA_LEN))
  head = redis.call("ZRANGEBYSCORE", K_QUEUED, "(" .. head[2], "+inf", "WITHSCORES", "LIMIT", 0, 1)
end
local due = redis.call("ZRANGEBYSCORE", K_SCHEDULED, "-inf", now_s, "WITHSCORES", "LIMIT", 0, 1)
older(due[2])
if raw > 0 then
  redis.call("SET", K_RAWSINCE, now_s, "NX")
  older(redis.call("GET", K_RAWSINCE))
end
return {
  redis.call("ZCARD", K_QUEUED) + redis.call("ZCOUNT", K_SCHEDULED, "-inf", now_s) + raw,
  redis.call("ZCOUNT", K_SCHEDULED, "(" .. now_s, "+inf"),
  redis.call("ZCARD", K_LEASES),
  redis.call("ZCARD", K_DEAD),
  redis.call("EXISTS", K_PAUSED),
  oldest,
}

--!script alert_record
-- KEYS: queue keys (of the event's queue). ARGV: now, key, kind, task ('' = none),
-- job id ('' = none), detail (already cut). Merges the event into the key's row.
local task, job_id = ARGV[4], ARGV[5]
if task == "" then task = false end
if job_id == "" then job_id = false end
record_alert(ARGV[2], ARGV[3], task, job_id, ARGV[6], ARGV[1])
return 1

--!script alert_claim
-- KEYS: queue keys. ARGV: now, next_at (now + lease_for), token base, then alert keys (picked by
-- the caller from alertdue). Each one still pending and due gets a fresh token and next_at, so no
-- other caller gets it until that lease runs out. Returns {key, row JSON, ...} of those claimed.
local now, next_at, tok = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local out = {}
for i = 4, #ARGV do
  local key = ARGV[i]
  local raw = redis.call("HGET", K_ALERTS, key)
  local a = raw and cjson.decode(raw)
  if not a or tonumber(a.c) == 0 then
    -- A due entry without a pending row (deleted by hand) would head alertdue forever.
    redis.call("ZREM", K_ALERTDUE, key)
  elseif tonumber(a.na) <= now then
    a.tok, a.na = tok .. string.format("%x", i), next_at
    raw = cjson.encode(a)
    redis.call("HSET", K_ALERTS, key, raw)
    redis.call("ZADD", K_ALERTDUE, next_at, key)
    out[#out + 1] = key
    out[#out + 1] = raw
  end
end
return out

--!script alert_finish
-- KEYS: queue keys. ARGV: key, token, count as claimed, next_at, now, op, [error]: op S (sent),
-- F (failed), Fe (failed, with error). Records one delivery attempt while the token still holds
-- the row; returns 1, or 0 (nothing written) when it does not.
local key, token, claimed, next_at, now_s, op = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local raw = redis.call("HGET", K_ALERTS, key)
if not raw then return 0 end
local a = cjson.decode(raw)
if a.tok ~= token then return 0 end
a.tok, a.na = nil, next_at
if op == "S" then
  -- Events recorded while the delivery was in flight stay pending.
  a.c = string.format("%d", math.max(0, tonumber(a.c) - claimed))
  a.at, a.le, a.sa = "0", nil, now_s
else
  a.at = string.format("%d", tonumber(a.at) + 1)
  a.le = nil
  if op == "Fe" then a.le = ARGV[7] end
end
redis.call("HSET", K_ALERTS, key, cjson.encode(a))
if tonumber(a.c) > 0 then
  redis.call("ZADD", K_ALERTDUE, next_at, key)
else
  redis.call("ZREM", K_ALERTDUE, key)
end
return 1

-- Flow control: each of these scripts works on ONE key of its own hash tag, P:rate:{K} or
-- P:slots:{K} (see brokers/redis.py), so every worker's acquire is one atomic step.

--!script rate
-- KEYS: P:rate:{K}, a string: the next free time. ARGV: now, now + interval, key TTL (ms).
-- Grants (records the next free time, returns false) when now is at or after the next free
-- time; otherwise records nothing and returns the next free time.
local free = redis.call("GET", KEYS[1])
if free and tonumber(ARGV[1]) < tonumber(free) then return free end
redis.call("SET", KEYS[1], ARGV[2], "PX", ARGV[3])
return false

--!script slot_acquire
-- KEYS: P:slots:{K}, a zset: holder -> expiry. ARGV: now, holder, limit, now + ttl, key TTL (ms).
-- Drops holders expired before now; then holds a slot for `holder` if it has one already or
-- fewer than `limit` are held. Returns 1 when held, else 0.
local key, holder = KEYS[1], ARGV[2]
redis.call("ZREMRANGEBYSCORE", key, "-inf", "(" .. ARGV[1])
if not redis.call("ZSCORE", key, holder) and redis.call("ZCARD", key) >= tonumber(ARGV[3]) then
  return 0
end
redis.call("ZADD", key, ARGV[4], holder)
expire_at_least(key, ARGV[5])
return 1

--!script slot_extend
-- KEYS: P:slots:{K}. ARGV: holder, now + ttl, key TTL (ms). Pushes the expiry of a slot still
-- held; one no longer held is not taken again. Returns 1 when extended.
if not redis.call("ZSCORE", KEYS[1], ARGV[1]) then return 0 end
redis.call("ZADD", KEYS[1], ARGV[2], ARGV[1])
expire_at_least(KEYS[1], ARGV[3])
return 1
