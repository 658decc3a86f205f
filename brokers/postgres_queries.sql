-- taskkit PostgreSQL broker: the named queries PostgresBroker runs.
--
-- Each section starts with `-- name: NAME` and holds one statement. `{schema}` is replaced by the
-- quoted schema name and `{channel}` by the schema's NOTIFY channel; the table layout and the
-- indexes are described at the top of postgres_migrations.sql.
--
-- Conventions: every time ($now, run_at, lease_until) is a float of seconds since the epoch from
-- the caller's clock; batches travel as parallel arrays unnested server-side, so a batch of any
-- size is one round trip; every write after a claim matches (id, lease_token): a non-NULL token
-- means state = 'running' (a CHECK constraint; see postgres_migrations.sql for why the state is
-- not repeated in these statements). Alerts are fenced the same way, by (key, token).
-- A statement that makes jobs runnable wakes idle workers with at most one pg_notify per queue
-- (payload: the queue name); notifications are delivered when the transaction commits. settle
-- also announces retries due soon as '<queue> <run_at>': listeners wake at that time.


-- name: lock_migrations
-- Serialises migrations of one schema across processes; released at commit or rollback.
SELECT pg_advisory_xact_lock(hashtextextended('taskkit.migrate:' || $1::text, 0));

-- name: create_version_table
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.schema_version (
    version     text PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: has_version_table
SELECT to_regclass('{schema}.schema_version') IS NOT NULL;

-- name: versions
SELECT version FROM {schema}.schema_version ORDER BY version;

-- name: record_version
INSERT INTO {schema}.schema_version (version) VALUES ($1);


-- name: enqueue
-- Insert a batch; rows whose id exists or whose dedupe key is held are skipped. Returns only the
-- skipped rows (by position in the input, 1-based), each with the id of the active job holding
-- its key and whether its id was taken, as this statement's snapshot sees them (rows inserted
-- earlier in the same batch, or committed meanwhile, are not visible: the caller resolves
-- those); or a single row with a NULL pos when every row was stored. The lookups are scalar
-- subqueries on the skipped rows only, one index probe each: a join would let the planner hash
-- the whole jobs table on every enqueue (a sequential scan that grows with the backlog), and the
-- usual batch, where nothing is skipped, costs no lookup at all (`skipped` is materialized so
-- the lookups run after the filter, and LIMIT keeps the planner from hashing the table for
-- them). `woken` is the outer side so the notification is sent whatever the rest returns.
-- $1 ids, $2 queues, $3 tasks, $4 priorities, $5 run_at, $6 max_attempts, $7 payloads,
-- $8 dedupe keys, $9 now
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::float8[], $6::int[],
                $7::text[], $8::text[])
         WITH ORDINALITY AS i(id, queue, task, priority, run_at, max_attempts, payload,
                              dedupe_key, pos)
),
inserted AS (
    INSERT INTO {schema}.jobs AS j
        (id, queue, task, state, priority, run_at, max_attempts, payload, dedupe_key, enqueued_at)
    SELECT id, queue, task, 'pending', priority, run_at, max_attempts, payload, dedupe_key, $9
    FROM input
    ORDER BY pos
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.queue
),
woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM inserted) AS q
),
skipped AS MATERIALIZED (
    SELECT i.pos, i.id, i.dedupe_key
    FROM input AS i
    WHERE NOT EXISTS (SELECT 1 FROM inserted AS s WHERE s.id = i.id)
)
SELECT k.pos,
       (SELECT h.id FROM {schema}.jobs AS h
        WHERE h.dedupe_key = k.dedupe_key AND h.state IN ('pending', 'running')
        LIMIT 1) AS holder,
       (SELECT true FROM {schema}.jobs AS e WHERE e.id = k.id LIMIT 1) IS NOT NULL AS id_taken
FROM woken
LEFT JOIN skipped AS k ON true
ORDER BY k.pos;


-- name: enqueue_one
-- The enqueue statement for a batch of one (a plain `await app.enqueue(...)`), with the same
-- answer: one row, whose pos is NULL when the job was stored, else pos 1 with the
-- holder of its dedupe key and whether its id was taken. Scalar parameters and a VALUES row
-- instead of eight one-element arrays, unnested, joined and sorted: the per-call work above the
-- commit's WAL flush is what a sequential producer waits on. The lookups sit in CASE branches,
-- so they run only when the insert was skipped.
-- $1 id, $2 queue, $3 task, $4 priority, $5 run_at, $6 max_attempts, $7 payload, $8 dedupe key,
-- $9 now
WITH inserted AS (
    INSERT INTO {schema}.jobs
        (id, queue, task, state, priority, run_at, max_attempts, payload, dedupe_key, enqueued_at)
    VALUES ($1::text, $2::text, $3::text, 'pending', $4::int, $5::float8, $6::int, $7::text,
            $8::text, $9::float8)
    ON CONFLICT DO NOTHING
    RETURNING queue
),
woken AS MATERIALIZED (
    SELECT count(pg_notify('{channel}', queue)) AS n FROM inserted
)
SELECT CASE WHEN w.n = 0 THEN 1 END AS pos,
       CASE WHEN w.n = 0 THEN
           (SELECT h.id FROM {schema}.jobs AS h
            WHERE h.dedupe_key = $8::text AND h.state IN ('pending', 'running')
            LIMIT 1)
       END AS holder,
       CASE WHEN w.n = 0 THEN
           (SELECT true FROM {schema}.jobs AS e WHERE e.id = $1::text LIMIT 1) IS NOT NULL
       END AS id_taken
FROM woken AS w;


-- name: enqueue_bytes
-- One foreign payload that text cannot hold, stored as bytes. $1 id, $2 queue, $3 payload, $4 now
WITH inserted AS (
    INSERT INTO {schema}.jobs (id, queue, state, run_at, payload_raw, enqueued_at)
    VALUES ($1, $2, 'pending', $4, $3, $4)
    RETURNING queue
)
SELECT count(pg_notify('{channel}', queue)) FROM inserted;


-- name: claim
-- Claim up to $3 due jobs: queues in the order of $1 (skipping paused ones), within a queue by
-- priority, run time and insertion order. Each claim starts an attempt: started_at = now, and
-- the previous attempt's progress is cleared. Each queue is read through jobs_claim_idx by its own
-- LATERAL scan; the outer LIMIT stops pulling (and locking) rows once $3 are taken, so a later
-- queue is only read when the earlier ones run dry. FOR UPDATE SKIP LOCKED lets concurrent
-- claimers pass each other; a row claimed meanwhile fails the re-checked state = 'pending'.
-- The claim commits without waiting for its WAL to reach disk (synchronous_commit off for this
-- transaction only, set by `relaxed`), which takes a WAL flush (0.4-2 ms here) off every pickup
-- and every claim of a drain. Nothing durable is at stake: a claim the server loses in a crash
-- is undone whole, so the job is pending again, uncharged, and is delivered again: the rerun
-- at-least-once already allows when a worker dies mid-job. Everything written after it (settle,
-- extend, release, enqueue) still waits for its flush, which covers the claim's WAL too, so a
-- settled job's claim can never be lost. A claim that finds nothing writes nothing and flushes
-- nothing either way.
-- $1 queues (no duplicates), $2 now, $3 limit, $4 lease seconds
WITH relaxed AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
),
wanted AS MATERIALIZED (
    SELECT q.name, q.pos
    FROM relaxed
    CROSS JOIN unnest($1::text[]) WITH ORDINALITY AS q(name, pos)
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.paused_queues AS p WHERE p.queue = q.name)
    ORDER BY q.pos
),
picked AS MATERIALIZED (
    SELECT c.id, w.pos
    FROM wanted AS w
    CROSS JOIN LATERAL (
        SELECT j.id
        FROM {schema}.jobs AS j
        WHERE j.state = 'pending' AND j.queue = w.name AND j.run_at <= $2
        ORDER BY j.priority DESC, j.run_at, j.seq
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) AS c
    LIMIT $3
),
claimed AS (
    UPDATE {schema}.jobs AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        lease_token = gen_random_uuid()::text,
        lease_until = $2 + $4,
        started_at = $2,
        progress = NULL
    FROM picked
    WHERE j.id = picked.id
    RETURNING j.id, j.queue, j.payload, j.payload_raw, j.attempts, j.lease_token, j.lease_until,
              j.priority, j.run_at, j.seq, picked.pos
)
SELECT id, queue, payload, payload_raw, attempts, lease_token, lease_until
FROM claimed
ORDER BY pos, priority DESC, run_at, seq;


-- name: extend
-- Heartbeat. Touches only lease_until, which no index covers, so the update can be HOT.
-- Returns the (id, token) pairs that still own their job; the rest were lost.
-- $1 ids, $2 tokens, $3 new lease_until
UPDATE {schema}.jobs AS j
SET lease_until = $3
FROM unnest($1::text[], $2::text[]) AS s(id, token)
WHERE j.id = s.id AND j.lease_token = s.token
RETURNING j.id, j.lease_token;


-- name: settle
-- Apply a batch of outcomes in one statement. kind: 'ack' (complete, nothing kept: the row is
-- deleted), 'keep' (complete, result kept until keep_until), 'retry', 'dead'. Returns the
-- (id, token) pairs applied. Retries that are due at once wake idle workers of their queue.
-- Every applied dead letter records its alert here, so in the dead letter's own transaction:
-- key dead:<queue>:<task> ('?' when the payload names none), merged as record_alert merges. One
-- INSERT ... ON CONFLICT cannot touch a row twice, so the batch's dead jobs are first grouped
-- per key: a group of n counts as n events, and its last job in batch order is the latest event
-- (job_id and detail). Alert rows are written in key order, so concurrent batches lock shared
-- keys in one order and cannot deadlock on them.
-- A retry due within $9 seconds is announced as '<queue> <run_at>' (one per distinct pair), so
-- that listeners wake when it comes due instead of at their next poll.
-- $1 ids, $2 tokens, $3 kinds, $4 text (result or error), $5 time (keep_until or run_at),
-- $6 charge_attempt, $7 now, $8 the alert detail limit (characters), $9 announce-ahead seconds
WITH s AS MATERIALIZED (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::bool[])
         WITH ORDINALITY AS s(id, token, kind, body, at, charge, pos)
),
acked AS (
    DELETE FROM {schema}.jobs AS j
    USING s
    WHERE s.kind = 'ack' AND j.id = s.id AND j.lease_token = s.token
    RETURNING j.id, s.token
),
moved AS (
    UPDATE {schema}.jobs AS j
    SET state = CASE s.kind WHEN 'keep' THEN 'done' WHEN 'retry' THEN 'pending' ELSE 'dead' END,
        result = CASE WHEN s.kind = 'keep' THEN s.body END,
        expires_at = CASE WHEN s.kind = 'keep' THEN s.at END,
        last_error = CASE WHEN s.kind = 'keep' THEN j.last_error ELSE s.body END,
        run_at = CASE WHEN s.kind = 'retry' THEN s.at ELSE j.run_at END,
        attempts = CASE WHEN s.kind = 'retry' AND NOT s.charge
                        THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
        finished_at = CASE WHEN s.kind = 'retry' THEN NULL ELSE $7::float8 END,
        lease_token = NULL,
        lease_until = NULL
    FROM s
    WHERE s.kind <> 'ack' AND j.id = s.id AND j.lease_token = s.token
    RETURNING j.id, s.token, j.queue, s.kind, s.at, s.body, s.pos,
              -- The payload is parsed only for a dead job stored without a task name.
              CASE WHEN s.kind = 'dead'
                   THEN coalesce(j.task, {schema}.payload_task(j.payload)) END AS task
),
woken AS (
    SELECT count(pg_notify('{channel}', q.payload)) AS n
    FROM (
        SELECT DISTINCT CASE WHEN at <= $7::float8 THEN queue ELSE queue || ' ' || at::text END
               AS payload
        FROM moved
        WHERE kind = 'retry' AND at <= $7::float8 + $9::float8
    ) AS q
),
dead AS (
    SELECT DISTINCT ON (d.key)
           d.key, d.queue, d.task, d.id AS job_id,
           coalesce(left(d.body, $8::int), '') AS detail,
           count(*) OVER (PARTITION BY d.key) AS events
    FROM (
        SELECT 'dead:' || m.queue || ':' || coalesce(m.task, '?') AS key, m.*
        FROM moved AS m
        WHERE m.kind = 'dead'
    ) AS d
    ORDER BY d.key, d.pos DESC
),
alerted AS (
    INSERT INTO {schema}.alerts AS a
        (key, kind, queue, task, job_id, detail, count, first_at, last_at, next_at)
    SELECT key, 'dead', queue, task, job_id, detail, events, $7::float8, $7::float8, $7::float8
    FROM dead
    ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET count = a.count + excluded.count,
        first_at = CASE WHEN a.count = 0 THEN excluded.first_at ELSE a.first_at END,
        last_at = excluded.last_at,
        next_at = CASE WHEN a.count = 0 THEN greatest(a.next_at, excluded.next_at)
                       ELSE a.next_at END,
        kind = excluded.kind,
        queue = excluded.queue,
        task = excluded.task,
        job_id = excluded.job_id,
        detail = excluded.detail
)
SELECT id, token FROM acked
UNION ALL
SELECT id, token FROM moved CROSS JOIN woken;


-- name: release
-- Hand jobs back on shutdown: pending, runnable now, the claim's attempt given back.
-- $1 ids, $2 tokens, $3 now
WITH released AS (
    UPDATE {schema}.jobs AS j
    SET state = 'pending',
        run_at = $3,
        attempts = greatest(j.attempts - 1, 0),
        lease_token = NULL,
        lease_until = NULL
    FROM unnest($1::text[], $2::text[]) AS s(id, token)
    WHERE j.id = s.id AND j.lease_token = s.token
    RETURNING j.queue
)
SELECT count(pg_notify('{channel}', q.queue))
FROM (SELECT DISTINCT queue FROM released) AS q;


-- name: reclaim_expired
-- Take over running jobs whose lease ended before $2: fresh token and lease, attempts unchanged.
-- Uses jobs_running_idx for the queue and filters lease_until on the running rows.
-- $1 queues, $2 now, $3 limit, $4 lease seconds
WITH expired AS MATERIALIZED (
    SELECT j.id
    FROM {schema}.jobs AS j
    WHERE j.state = 'running' AND j.queue = ANY($1::text[]) AND j.lease_until < $2
    ORDER BY j.lease_until
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET lease_token = gen_random_uuid()::text,
    lease_until = $2 + $4
FROM expired
WHERE j.id = expired.id
RETURNING j.id, j.queue, j.payload, j.payload_raw, j.attempts, j.lease_token, j.lease_until;


-- name: prune
-- The periodic cleanup, one statement: up to $2 kept results and cancelled jobs that expired by
-- $1 (jobs_expiry_idx); and up to $2 each of delivered alerts (count 0, no claim) whose next_at
-- is more than $3 seconds old, rate keys idle that long, and slots expired that long (their
-- holders are gone; see the slots layout note). SKIP LOCKED: rows in use are left for the next
-- pass, and the pass never waits on (or deadlocks with) the writers. Returns how many jobs went.
WITH gone AS (
    DELETE FROM {schema}.jobs
    WHERE id IN (
        SELECT id FROM {schema}.jobs
        WHERE state IN ('done', 'cancelled') AND expires_at <= $1
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
),
old_alerts AS (
    DELETE FROM {schema}.alerts
    WHERE key IN (
        SELECT key FROM {schema}.alerts
        WHERE count = 0 AND token IS NULL AND next_at < $1 - $3
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
),
idle_rates AS (
    DELETE FROM {schema}.rates
    WHERE key IN (
        SELECT key FROM {schema}.rates
        WHERE next_free < $1 - $3
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
),
stale_slots AS (
    DELETE FROM {schema}.slots
    WHERE (key, holder) IN (
        SELECT key, holder FROM {schema}.slots
        WHERE expires_at < $1 - $3
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
)
SELECT count(*) FROM gone;


-- name: get_job
-- One job; a kept result or a cancelled job past its expiry counts as gone even before it is
-- pruned.
SELECT id, queue, state, task, attempts, payload, payload_raw, max_attempts, priority, run_at,
       enqueued_at, finished_at, last_error, result, dedupe_key, started_at, progress
FROM {schema}.jobs
WHERE id = $1 AND NOT (state IN ('done', 'cancelled') AND expires_at <= $2);


-- name: stats
-- Counts per queue, plus every paused queue, and when each queue's longest-waiting ready job
-- became due (its run_at; NULL when nothing is ready). A queue whose only jobs are kept results or
-- cancelled jobs is listed (with zero counts), as the memory broker does; neither is counted.
WITH counts AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'pending' AND run_at <= $1) AS ready,
           count(*) FILTER (WHERE state = 'pending' AND run_at > $1) AS scheduled,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'dead') AS dead,
           min(run_at) FILTER (WHERE state = 'pending' AND run_at <= $1) AS oldest_ready_at
    FROM {schema}.jobs
    WHERE state NOT IN ('done', 'cancelled') OR expires_at > $1
    GROUP BY queue
)
SELECT coalesce(c.queue, p.queue) AS queue,
       coalesce(c.ready, 0) AS ready,
       coalesce(c.scheduled, 0) AS scheduled,
       coalesce(c.running, 0) AS running,
       coalesce(c.dead, 0) AS dead,
       p.queue IS NOT NULL AS paused,
       c.oldest_ready_at
FROM counts AS c
FULL JOIN {schema}.paused_queues AS p ON p.queue = c.queue
ORDER BY 1;


-- name: list_dead
-- Dead jobs newest first, of queue $1 when not NULL, at most $2.
SELECT id, queue, state, task, attempts, payload, payload_raw, max_attempts, priority, run_at,
       enqueued_at, finished_at, last_error, result, dedupe_key, started_at, progress
FROM {schema}.jobs
WHERE state = 'dead' AND ($1::text IS NULL OR queue = $1)
ORDER BY finished_at DESC, seq DESC
LIMIT $2;


-- name: requeue_dead
-- Revive dead jobs (ids $1, or all when NULL; of queue $2 when not NULL): pending, runnable at
-- $3, attempts reset. A job whose dedupe key another active job holds stays dead; of several
-- dead jobs sharing a key only the oldest is revived. The update re-checks state = 'dead', so
-- concurrent requeues revive a job once; a key taken by a concurrent enqueue meanwhile raises a
-- unique violation, and the caller runs the statement again.
WITH picked AS MATERIALIZED (
    SELECT DISTINCT ON (coalesce('k:' || j.dedupe_key, 'i:' || j.id)) j.id
    FROM {schema}.jobs AS j
    WHERE j.state = 'dead'
      AND ($1::text[] IS NULL OR j.id = ANY($1::text[]))
      AND ($2::text IS NULL OR j.queue = $2)
      AND (j.dedupe_key IS NULL OR NOT EXISTS (
              SELECT 1 FROM {schema}.jobs AS h
              WHERE h.dedupe_key = j.dedupe_key AND h.state IN ('pending', 'running')))
    ORDER BY coalesce('k:' || j.dedupe_key, 'i:' || j.id), j.seq
),
revived AS (
    UPDATE {schema}.jobs AS j
    SET state = 'pending',
        attempts = 0,
        run_at = $3,
        finished_at = NULL,
        lease_token = NULL,
        lease_until = NULL
    FROM picked
    WHERE j.id = picked.id AND j.state = 'dead'
    RETURNING j.id, j.queue, j.seq
),
woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM revived) AS q
)
SELECT id FROM revived CROSS JOIN woken ORDER BY seq;


-- name: purge_dead
-- Delete dead jobs selected as in requeue_dead. Returns how many went.
WITH gone AS (
    DELETE FROM {schema}.jobs
    WHERE state = 'dead'
      AND ($1::text[] IS NULL OR id = ANY($1::text[]))
      AND ($2::text IS NULL OR queue = $2)
    RETURNING 1
)
SELECT count(*) FROM gone;


-- name: cancel
-- Cancel job $1 if it is pending (due or scheduled): state cancelled, kept until $2, cancelled at
-- $3. Its dedupe key is free from then on (jobs_dedupe_idx covers pending and running rows).
-- Returns the job's state after the call and its expiry, or no row for an unknown id.
-- The row is locked first: a claim or settle in flight is waited for, and the state read is the
-- one it committed (FOR UPDATE returns the newest row version), so a job claimed meanwhile
-- reports running and is left alone. The UPDATE then acts on the locked row only if pending.
WITH target AS MATERIALIZED (
    SELECT id, state, expires_at FROM {schema}.jobs WHERE id = $1 FOR UPDATE
),
cancelled AS (
    UPDATE {schema}.jobs AS j
    SET state = 'cancelled',
        finished_at = $3,
        expires_at = $2
    FROM target AS t
    WHERE j.id = t.id AND t.state = 'pending'
    RETURNING j.state, j.expires_at
)
SELECT coalesce(c.state, t.state) AS state, coalesce(c.expires_at, t.expires_at) AS expires_at
FROM target AS t
LEFT JOIN cancelled AS c ON true;


-- name: set_progress
-- Store progress $3 on job $1 while token $2 owns it (a non-NULL token means running). Touches
-- only the unindexed progress column, so the update can be HOT. Returns a row when applied.
UPDATE {schema}.jobs
SET progress = $3
WHERE id = $1 AND lease_token = $2
RETURNING 1;


-- name: pause
INSERT INTO {schema}.paused_queues (queue) VALUES ($1) ON CONFLICT DO NOTHING;

-- name: resume
WITH resumed AS (
    DELETE FROM {schema}.paused_queues WHERE queue = $1 RETURNING queue
)
SELECT count(pg_notify('{channel}', queue)) FROM resumed;


-- name: record_alert
-- Merge one event into its key's row (see Broker.record_alert): a new row counts 1; a delivered
-- row (count 0) starts over at 1 from now but keeps a quiet window that has not ended
-- (next_at = greatest(next_at, now)); a pending row counts one more, its next_at unchanged.
-- The latest event names the row. settle applies this same merge to dead letters: keep the two
-- alike. $1 key, $2 kind, $3 queue, $4 task, $5 job id, $6 detail (already cut), $7 now
INSERT INTO {schema}.alerts AS a
    (key, kind, queue, task, job_id, detail, count, first_at, last_at, next_at)
VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::text, 1,
        $7::float8, $7::float8, $7::float8)
ON CONFLICT (key) DO UPDATE
SET count = a.count + excluded.count,
    first_at = CASE WHEN a.count = 0 THEN excluded.first_at ELSE a.first_at END,
    last_at = excluded.last_at,
    next_at = CASE WHEN a.count = 0 THEN greatest(a.next_at, excluded.next_at)
                   ELSE a.next_at END,
    kind = excluded.kind,
    queue = excluded.queue,
    task = excluded.task,
    job_id = excluded.job_id,
    detail = excluded.detail;


-- name: claim_alerts
-- Hand out up to $2 pending alerts due by $1, earliest next_at first: a fresh token each, and
-- next_at = $1 + $3 as the claim's lease, so nobody else claims them until it runs out (then the
-- next claim's token fences this one off). SKIP LOCKED lets concurrent claimers pass each other;
-- a row claimed meanwhile fails the re-checked next_at <= $1. Returns the rows as claimed.
-- $1 now, $2 limit, $3 lease seconds
WITH due AS MATERIALIZED (
    SELECT key, next_at
    FROM {schema}.alerts
    WHERE count > 0 AND next_at <= $1::float8
    ORDER BY next_at, key
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE {schema}.alerts AS a
    SET token = gen_random_uuid()::text,
        next_at = $1::float8 + $3::float8
    FROM due
    WHERE a.key = due.key
    RETURNING a.key, a.kind, a.queue, a.task, a.job_id, a.detail, a.count, a.first_at,
              a.last_at, a.next_at, a.attempts, a.last_error, a.sent_at, a.token,
              due.next_at AS due_at
)
SELECT key, kind, queue, task, job_id, detail, count, first_at, last_at, next_at, attempts,
       last_error, sent_at, token
FROM claimed
ORDER BY due_at, key;


-- name: finish_alert
-- Record one delivery attempt of alert $1 while token $2 still holds it: the token is cleared
-- and next_at set to $4. Sent ($3): the $5 events delivered are taken off the count (events
-- recorded during the delivery stay pending), attempts and last_error reset, sent_at = $7.
-- Not sent: attempts + 1, last_error = $6. Returns a row when applied.
UPDATE {schema}.alerts
SET token = NULL,
    next_at = $4::float8,
    count = CASE WHEN $3::bool THEN greatest(count - $5::int, 0) ELSE count END,
    attempts = CASE WHEN $3::bool THEN 0 ELSE attempts + 1 END,
    last_error = CASE WHEN $3::bool THEN NULL ELSE $6::text END,
    sent_at = CASE WHEN $3::bool THEN $7::float8 ELSE sent_at END
WHERE key = $1::text AND token = $2::text
RETURNING 1;


-- name: list_alerts
-- Alert rows, oldest first_at first; only pending ones (count > 0) when $1. At most $2.
SELECT key, kind, queue, task, job_id, detail, count, first_at, last_at, next_at, attempts,
       last_error, sent_at, token
FROM {schema}.alerts
WHERE count > 0 OR NOT $1::bool
ORDER BY first_at, key
LIMIT $2;


-- name: acquire_rate
-- One grant per $2 seconds for key $1: the upsert writes next_free = $3 + $2 only when the row
-- is new or its next_free <= $3, re-checked on the newest row version under the row lock, so of
-- racing callers exactly one is granted. A refusal writes nothing. free_at is the next free time
-- as this statement's snapshot saw it: when a concurrent grant committed after the snapshot it is
-- stale (NULL, or not after $3), and the caller reads it again with rate_free_at.
-- $1 key, $2 interval, $3 now
WITH granted AS (
    INSERT INTO {schema}.rates AS r (key, next_free)
    VALUES ($1::text, $3::float8 + $2::float8)
    ON CONFLICT (key) DO UPDATE
    SET next_free = excluded.next_free
    WHERE r.next_free <= $3::float8
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM granted) AS granted,
       (SELECT next_free FROM {schema}.rates WHERE key = $1::text) AS free_at;

-- name: rate_free_at
SELECT next_free FROM {schema}.rates WHERE key = $1::text;


-- name: lock_slot_key
-- Serialises acquire_slot per key (and schema) until the transaction ends. It must be its own
-- statement, before acquire_slot: a statement's snapshot is taken when it starts, so a lock taken
-- inside it would not make the holders committed while it waited visible.
SELECT pg_advisory_xact_lock(hashtextextended('{channel}.slot:' || $1::text, 0));

-- name: acquire_slot
-- Under lock_slot_key: hold a slot of key $1 for holder $2 until $5 + $4 if it already holds one
-- or fewer than $3 others do; drop the key's holders expired before $5 (the holder's own expired
-- row is renewed instead when it gets the slot). The key's rows are locked first, in holder
-- order, so a heartbeat or release committed meanwhile is counted as it now is (FOR UPDATE reads
-- the newest row version). Returns whether the slot is held.
-- $1 key, $2 holder, $3 limit, $4 ttl, $5 now
WITH held AS MATERIALIZED (
    SELECT holder, expires_at
    FROM {schema}.slots
    WHERE key = $1::text
    ORDER BY holder
    FOR UPDATE
),
decision AS MATERIALIZED (
    SELECT coalesce(bool_or(holder = $2::text), false)
           OR count(*) FILTER (WHERE holder <> $2::text) < $3::int AS granted
    FROM held
    WHERE expires_at >= $5::float8
),
dropped AS (
    DELETE FROM {schema}.slots AS s
    USING decision AS d
    WHERE s.key = $1::text AND s.expires_at < $5::float8 AND (s.holder <> $2::text OR NOT d.granted)
),
taken AS (
    INSERT INTO {schema}.slots AS s (key, holder, expires_at)
    SELECT $1::text, $2::text, $5::float8 + $4::float8
    FROM decision AS d
    WHERE d.granted
    ON CONFLICT (key, holder) DO UPDATE
    SET expires_at = excluded.expires_at
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM taken);


-- name: extend_slots
-- Heartbeat: expiry $3 for each (key $1, holder $2) row still present (an expired row nobody has
-- dropped yet is nobody else's: the key's next acquire would have dropped it). Rows are locked in
-- (key, holder) order, as acquire_slot locks them, so the two cannot deadlock.
WITH target AS MATERIALIZED (
    SELECT s.key, s.holder
    FROM {schema}.slots AS s
    JOIN unnest($1::text[], $2::text[]) AS x(key, holder)
      ON s.key = x.key AND s.holder = x.holder
    ORDER BY s.key, s.holder
    FOR UPDATE OF s
)
UPDATE {schema}.slots AS s
SET expires_at = $3::float8
FROM target AS t
WHERE s.key = t.key AND s.holder = t.holder;


-- name: release_slots
-- Give back each (key $1, holder $2) slot; rows are locked in (key, holder) order (see above).
WITH target AS MATERIALIZED (
    SELECT s.key, s.holder
    FROM {schema}.slots AS s
    JOIN unnest($1::text[], $2::text[]) AS x(key, holder)
      ON s.key = x.key AND s.holder = x.holder
    ORDER BY s.key, s.holder
    FOR UPDATE OF s
)
DELETE FROM {schema}.slots AS s
USING target AS t
WHERE s.key = t.key AND s.holder = t.holder;
