-- The SQLite broker's schema and statements. Each statement is a named section
-- ("-- name: NAME") loaded once by brokers/sqlite.py.
--
-- Table layout
--   jobs            one row per live job; a job that completes without a kept result is deleted
--     seq           insertion order: the tie-break after priority and run time
--     id            the job id (32 hex characters, or a broker-made id for raw payloads)
--     queue, task   task is best effort (NULL when the payload does not decode)
--     state         pending | running | done | dead | cancelled
--                   (scheduled = pending with run_at > now)
--     priority      higher first
--     run_at        seconds since the epoch, from the core's clock
--     attempts      executions started; the claim adds one
--     payload       the wire JSON exactly as enqueued (TEXT: a foreign payload may not decode)
--     lease_token   fences every write after a claim; NULL unless running
--     lease_until   when the lease runs out
--     result        JSON text of a kept return value; expires_at says until when (also for
--                   cancelled jobs)
--     started_at    when the latest attempt was claimed; progress: what it reported (JSON)
--   paused_queues   one row per paused queue

-- name: schema
CREATE TABLE IF NOT EXISTS jobs (
    seq          INTEGER PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    queue        TEXT NOT NULL,
    task         TEXT,
    state        TEXT NOT NULL,
    priority     INTEGER NOT NULL DEFAULT 0,
    run_at       REAL NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER,
    payload      TEXT NOT NULL,
    dedupe_key   TEXT,
    lease_token  TEXT,
    lease_until  REAL,
    last_error   TEXT,
    result       TEXT,
    enqueued_at  REAL NOT NULL,
    started_at   REAL,
    finished_at  REAL,
    expires_at   REAL,
    progress     TEXT
);
CREATE INDEX IF NOT EXISTS jobs_claim ON jobs (queue, priority DESC, run_at, seq)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS jobs_lease ON jobs (queue, lease_until) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs (queue, finished_at) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS jobs_expiry ON jobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS jobs_dedupe ON jobs (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running');
CREATE TABLE IF NOT EXISTS paused_queues (queue TEXT PRIMARY KEY);
PRAGMA user_version = 1;

-- name: find_active_dedupe
SELECT id FROM jobs WHERE dedupe_key = ? AND state IN ('pending', 'running');

-- name: exists
SELECT 1 FROM jobs WHERE id = ?;

-- name: insert
INSERT INTO jobs (id, queue, task, state, priority, run_at, max_attempts, payload, dedupe_key,
                  enqueued_at)
VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?);

-- name: claim
UPDATE jobs
SET state = 'running', attempts = attempts + 1, lease_until = :lease_until,
    lease_token = lower(hex(randomblob(16))), started_at = :now, progress = NULL
WHERE seq IN (
    SELECT seq FROM jobs
    WHERE queue = :queue AND state = 'pending' AND run_at <= :now
    ORDER BY priority DESC, run_at, seq
    LIMIT :limit
)
RETURNING id, queue, payload, attempts, lease_token, lease_until, priority, run_at, seq;

-- name: is_paused
SELECT 1 FROM paused_queues WHERE queue = ?;

-- name: extend
UPDATE jobs SET lease_until = ? WHERE id = ? AND lease_token = ? AND state = 'running';

-- name: complete_delete
DELETE FROM jobs WHERE id = ? AND lease_token = ? AND state = 'running';

-- name: complete_keep
UPDATE jobs
SET state = 'done', result = ?, expires_at = ?, finished_at = ?, lease_token = NULL
WHERE id = ? AND lease_token = ? AND state = 'running';

-- name: retry
UPDATE jobs
SET state = 'pending', run_at = ?, last_error = ?, attempts = max(0, attempts - ?),
    lease_token = NULL
WHERE id = ? AND lease_token = ? AND state = 'running';

-- name: dead
UPDATE jobs
SET state = 'dead', last_error = ?, finished_at = ?, lease_token = NULL
WHERE id = ? AND lease_token = ? AND state = 'running';

-- name: release
UPDATE jobs
SET state = 'pending', run_at = ?, attempts = max(0, attempts - 1), lease_token = NULL
WHERE id = ? AND lease_token = ? AND state = 'running';

-- name: reclaim
UPDATE jobs
SET lease_until = :lease_until, lease_token = lower(hex(randomblob(16)))
WHERE seq IN (
    SELECT seq FROM jobs
    WHERE queue = :queue AND state = 'running' AND lease_until < :now
    LIMIT :limit
)
RETURNING id, queue, payload, attempts, lease_token, lease_until;

-- name: purge_expired_results
DELETE FROM jobs WHERE expires_at IS NOT NULL AND expires_at <= ?;

-- name: get
SELECT id, queue, task, state, attempts, payload, max_attempts, priority, run_at, enqueued_at,
       finished_at, last_error, result, dedupe_key, expires_at, started_at, progress
FROM jobs WHERE id = ?;

-- name: stats
SELECT queue,
       sum(state = 'pending' AND run_at <= :now),
       sum(state = 'pending' AND run_at > :now),
       sum(state = 'running'),
       sum(state = 'dead')
FROM jobs GROUP BY queue;

-- name: cancel
UPDATE jobs SET state = 'cancelled', finished_at = ?, expires_at = ?
WHERE id = ? AND state = 'pending';

-- name: state_of
SELECT state, expires_at FROM jobs WHERE id = ?;

-- name: set_progress
UPDATE jobs SET progress = ? WHERE id = ? AND lease_token = ? AND state = 'running';

-- name: paused
SELECT queue FROM paused_queues;

-- name: list_dead
SELECT id, queue, task, state, attempts, payload, max_attempts, priority, run_at, enqueued_at,
       finished_at, last_error, result, dedupe_key, expires_at, started_at, progress
FROM jobs WHERE state = 'dead' AND (:queue IS NULL OR queue = :queue)
ORDER BY finished_at DESC, seq DESC LIMIT :limit;

-- name: select_dead
SELECT id, dedupe_key FROM jobs WHERE state = 'dead' AND (:queue IS NULL OR queue = :queue);

-- name: requeue
UPDATE jobs
SET state = 'pending', attempts = 0, run_at = ?, finished_at = NULL, last_error = last_error
WHERE id = ? AND state = 'dead';

-- name: purge
DELETE FROM jobs WHERE id = ? AND state = 'dead';

-- name: pause
INSERT OR IGNORE INTO paused_queues (queue) VALUES (?);

-- name: resume
DELETE FROM paused_queues WHERE queue = ?;
