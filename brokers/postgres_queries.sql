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
-- not repeated in these statements).
-- A statement that makes jobs runnable wakes idle workers with at most one pg_notify per queue
-- (payload: the queue name); notifications are delivered when the transaction commits.


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
-- Insert a batch; rows whose id exists or whose dedupe key is held are skipped. Per input row:
-- whether it was stored and, for a skipped row, the id of the active job holding its key and
-- whether its id was taken, as this statement's snapshot sees them (rows inserted earlier in the
-- same batch, or committed meanwhile, are not visible: the caller resolves those).
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
)
SELECT i.id, i.dedupe_key, s.id IS NOT NULL AS stored, h.id AS holder,
       e.id IS NOT NULL AS id_taken
FROM input AS i
CROSS JOIN woken
LEFT JOIN inserted AS s ON s.id = i.id
LEFT JOIN {schema}.jobs AS h
       ON s.id IS NULL AND h.dedupe_key = i.dedupe_key AND h.state IN ('pending', 'running')
LEFT JOIN {schema}.jobs AS e ON s.id IS NULL AND e.id = i.id
ORDER BY i.pos;


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
-- $1 queues (no duplicates), $2 now, $3 limit, $4 lease seconds
WITH wanted AS MATERIALIZED (
    SELECT q.name, q.pos
    FROM unnest($1::text[]) WITH ORDINALITY AS q(name, pos)
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
-- $1 ids, $2 tokens, $3 kinds, $4 text (result or error), $5 time (keep_until or run_at),
-- $6 charge_attempt, $7 now
WITH s AS MATERIALIZED (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::bool[])
         AS s(id, token, kind, body, at, charge)
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
    RETURNING j.id, s.token, j.queue, s.kind, s.at
),
woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM moved WHERE kind = 'retry' AND at <= $7) AS q
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


-- name: prune_results
-- Drop up to $2 kept results and cancelled jobs that expired by $1 (jobs_expiry_idx). Returns
-- how many went.
WITH gone AS (
    DELETE FROM {schema}.jobs
    WHERE id IN (
        SELECT id FROM {schema}.jobs
        WHERE state IN ('done', 'cancelled') AND expires_at <= $1
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
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
-- Counts per queue, plus every paused queue. A queue whose only jobs are kept results or
-- cancelled jobs is listed (with zero counts), as the memory broker does; neither is counted.
WITH counts AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'pending' AND run_at <= $1) AS ready,
           count(*) FILTER (WHERE state = 'pending' AND run_at > $1) AS scheduled,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'dead') AS dead
    FROM {schema}.jobs
    WHERE state NOT IN ('done', 'cancelled') OR expires_at > $1
    GROUP BY queue
)
SELECT coalesce(c.queue, p.queue) AS queue,
       coalesce(c.ready, 0) AS ready,
       coalesce(c.scheduled, 0) AS scheduled,
       coalesce(c.running, 0) AS running,
       coalesce(c.dead, 0) AS dead,
       p.queue IS NOT NULL AS paused
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

