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
--   alerts          the alert outbox: one row per alert key, events of one key merged into it
--     count         events not yet delivered (0 once delivered; kept for its quiet window)
--     first_at      the first undelivered event; last_at the latest; job_id, detail its own
--     next_at       earliest (re)try: claim lease, failed-delivery backoff or quiet window end
--     token         set by a claim, fences the delivery's finish; NULL when not claimed
--     attempts      failed deliveries since the last success; last_error the latest failure
--   rates           one row per rate-limit key: free_at, when the next grant may be given
--                   (a row whose free_at is past means the same as none: idle ones are pruned)
--   slots           one row per held concurrency slot (key, holder) until expires_at (an
--                   expired row is dropped by the key's next acquire or the recovery pass)
--
-- Versions (PRAGMA user_version, stamped by brokers/sqlite.py after the schema section runs;
-- every statement there is idempotent, so running it upgrades any older file in place)
--   0  the first release: jobs without started_at and progress; paused_queues
--   1  jobs.started_at and jobs.progress (added by ALTER TABLE on older files)
--   2  alerts, rates and slots

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
CREATE TABLE IF NOT EXISTS alerts (
    key        TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    queue      TEXT NOT NULL,
    task       TEXT,
    job_id     TEXT,
    detail     TEXT NOT NULL,
    count      INTEGER NOT NULL,
    first_at   REAL NOT NULL,
    last_at    REAL NOT NULL,
    next_at    REAL NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    sent_at    REAL,
    token      TEXT
);
-- Claims look for pending rows that are due, the recovery pass for delivered rows long quiet.
CREATE INDEX IF NOT EXISTS alerts_due ON alerts (next_at) WHERE count > 0;
CREATE INDEX IF NOT EXISTS alerts_quiet ON alerts (next_at) WHERE count = 0;
CREATE TABLE IF NOT EXISTS rates (
    key     TEXT PRIMARY KEY,
    free_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS slots (
    key        TEXT NOT NULL,
    holder     TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (key, holder)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS slots_expiry ON slots (expires_at);

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
-- RETURNING: the alert recorded in the same transaction needs the job's queue and task.
UPDATE jobs
SET state = 'dead', last_error = ?, finished_at = ?, lease_token = NULL
WHERE id = ? AND lease_token = ? AND state = 'running'
RETURNING queue, task;

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

-- name: purge_quiet_alerts
-- A delivered alert whose quiet window ended long ago behaves exactly like no row at all.
DELETE FROM alerts WHERE count = 0 AND next_at < ?;

-- name: purge_expired_slots
DELETE FROM slots WHERE expires_at < ?;

-- name: purge_idle_rates
-- A free time in the past means the same as no row. No index: one row per rate key (a task
-- name), so the scan is tiny, and every grant stays a single-row write.
DELETE FROM rates WHERE free_at < ?;

-- name: get
SELECT id, queue, task, state, attempts, payload, max_attempts, priority, run_at, enqueued_at,
       finished_at, last_error, result, dedupe_key, expires_at, started_at, progress
FROM jobs WHERE id = ?;

-- name: stats
SELECT queue,
       sum(state = 'pending' AND run_at <= :now),
       sum(state = 'pending' AND run_at > :now),
       sum(state = 'running'),
       sum(state = 'dead'),
       min(CASE WHEN state = 'pending' AND run_at <= :now THEN run_at END)
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

-- name: record_alert
-- On conflict every right-hand side reads the row as it was, so the CASEs see the old count.
INSERT INTO alerts (key, kind, queue, task, job_id, detail, count, first_at, last_at, next_at)
VALUES (:key, :kind, :queue, :task, :job_id, :detail, 1, :now, :now, :now)
ON CONFLICT (key) DO UPDATE
SET kind = excluded.kind, queue = excluded.queue, task = excluded.task,
    job_id = excluded.job_id, detail = excluded.detail,
    count = alerts.count + 1,
    first_at = CASE WHEN alerts.count = 0 THEN excluded.first_at ELSE alerts.first_at END,
    last_at = excluded.last_at,
    next_at = CASE WHEN alerts.count = 0 THEN max(alerts.next_at, excluded.next_at)
                   ELSE alerts.next_at END;

-- name: due_alerts
SELECT key FROM alerts WHERE count > 0 AND next_at <= :now
ORDER BY next_at, first_at, key LIMIT :limit;

-- name: claim_alert
UPDATE alerts SET token = lower(hex(randomblob(16))), next_at = :lease_until
WHERE key = :key
RETURNING key, kind, queue, task, job_id, detail, count, first_at, last_at, next_at, attempts,
          last_error, sent_at, token;

-- name: finish_alert_sent
UPDATE alerts
SET token = NULL, next_at = :next_at, count = max(0, count - :count), attempts = 0,
    last_error = NULL, sent_at = :now
WHERE key = :key AND token = :token;

-- name: finish_alert_failed
UPDATE alerts
SET token = NULL, next_at = :next_at, attempts = attempts + 1, last_error = :error
WHERE key = :key AND token = :token;

-- name: list_alerts
SELECT key, kind, queue, task, job_id, detail, count, first_at, last_at, next_at, attempts,
       last_error, sent_at, token
FROM alerts WHERE NOT :pending_only OR count > 0
ORDER BY first_at, key LIMIT :limit;

-- name: acquire_rate
-- Changes the row only when its next free time has come: a refusal records nothing.
INSERT INTO rates (key, free_at) VALUES (:key, :free_at)
ON CONFLICT (key) DO UPDATE SET free_at = excluded.free_at WHERE rates.free_at <= :now;

-- name: rate_free_at
SELECT free_at FROM rates WHERE key = ?;

-- name: drop_expired_holders
DELETE FROM slots WHERE key = ? AND expires_at < ?;

-- name: acquire_slot
-- Holds (or renews) the slot when the holder already has one or fewer than :limit are held.
-- "WHERE" on the SELECT keeps the parser from reading ON CONFLICT as a join constraint.
INSERT INTO slots (key, holder, expires_at)
SELECT :key, :holder, :expires_at
WHERE EXISTS (SELECT 1 FROM slots WHERE key = :key AND holder = :holder)
   OR (SELECT count(*) FROM slots WHERE key = :key) < :limit
ON CONFLICT (key, holder) DO UPDATE SET expires_at = excluded.expires_at;

-- name: extend_slot
UPDATE slots SET expires_at = ? WHERE key = ? AND holder = ?;

-- name: release_slot
DELETE FROM slots WHERE key = ? AND holder = ?;
