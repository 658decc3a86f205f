-- taskkit PostgreSQL broker: schema migrations.
--
-- Applied in order by `taskkit migrate` (PostgresBroker.migrate). Each section starts with a line
-- `-- migration: NNNN_name`; a section is applied once, inside one transaction that first takes
-- pg_advisory_xact_lock (so several processes may migrate at once) and records its version in
-- {schema}.schema_version. Never edit a released section: add a new one.
--
-- `{schema}` is replaced by the quoted schema name (default "taskkit", from ?schema=NAME) and
-- `{channel}` by the LISTEN/NOTIFY channel of that schema ("taskkit.<schema>").
--
-- Table layout
-- ------------
-- {schema}.jobs: the live jobs, one row each. Rows leave the table when a job completes without
-- a kept result (DELETE at settle), when a kept result or a cancelled job expires (pruned in
-- batches), or when dead jobs are purged. Times are float seconds since the epoch from the caller's clock (the core's
-- `now`), never SQL now(), so a fake clock drives every state change. Only foreign producers
-- (the enqueue function, column defaults) stamp times with the database clock.
--
--   id            text PK     the envelope's id (32 hex chars for jobs taskkit creates)
--   seq           bigint      insertion order: FIFO tie-break after priority and run_at
--   queue         text        queue name (validated by the producer)
--   task          text        task name, best effort (NULL for foreign payloads that do not parse)
--   state         text        pending | running | done | dead | cancelled (0002)
--                             ("scheduled" = pending, run_at > now)
--   priority      int         higher first
--   run_at        float8      runnable from; also the retry time
--   attempts      int         claims charged so far (reclaims do not charge again)
--   max_attempts  int         copied from the envelope, for listings only; the core decides
--   payload       text        the wire JSON exactly as given (text, not jsonb: foreign payloads
--                             may not even be JSON, and must be delivered to be dead-lettered)
--   payload_raw   bytea       instead of payload, for a foreign payload text cannot hold (bytes
--                             that are not UTF-8, or NUL characters); delivered as bytes
--   dedupe_key    text        unique among pending and running jobs
--   lease_token   text        fresh per claim/reclaim; fences every later write; set exactly
--                             while the job is running
--   lease_until   float8      lease expiry of a running job
--   last_error    text        the last retry or dead-letter reason
--   result        text        kept result (JSON text) of a done job
--   enqueued_at, finished_at  float8   (finished_at of a cancelled job: when it was cancelled)
--   expires_at    float8      when a done job's kept result, or a cancelled job, may be dropped
--   started_at    float8      (0002) when the latest attempt was claimed; set by every claim
--   progress      text        (0002) JSON text written by the latest attempt; cleared by every
--                             claim, written only under the attempt's lease token
--
-- Indexes, all partial so each covers only the rows one query looks for:
--   jobs_claim_idx    (queue, priority DESC, run_at, seq) WHERE state = 'pending'
--                     the claim scan reads it in claim order, one queue at a time.
--   jobs_running_idx  (queue) WHERE state = 'running'
--                     the reaper filters lease_until on the (small) running set. lease_until is
--                     deliberately NOT indexed: heartbeats only touch lease_until, so with no
--                     index on it and fillfactor < 100 they are HOT updates (no index writes).
--   jobs_dedupe_idx   UNIQUE (dedupe_key) WHERE dedupe_key IS NOT NULL
--                                       AND state IN ('pending', 'running')
--                     enqueue uses INSERT ... ON CONFLICT DO NOTHING against it; jobs without
--                     a key cost it nothing.
--   jobs_dead_idx     (finished_at DESC) WHERE state = 'dead'     dead-letter listings.
--   jobs_expiry_idx   (expires_at) WHERE state IN ('done', 'cancelled')
--                     pruning of kept results and cancelled jobs (0002; 0001 had 'done' only).
--
-- Fencing: the CHECK below makes lease_token non-NULL exactly while state = 'running', so the
-- batched writes after a claim (settle, extend, release) match on (id, lease_token) alone. They
-- deliberately do not repeat state = 'running': that condition would let the planner, misled by
-- statistics taken when nothing ran ("no running rows"), drive the batch from a scan of
-- jobs_running_idx joined against every batch row, instead of one primary-key lookup per row.
--
-- {schema}.paused_queues: one row per paused queue; claims skip them.
--
-- {schema}.enqueue(...): the SQL entry point for foreign producers (see the function's comment).
-- A bare `INSERT INTO {schema}.jobs (payload) VALUES ('{"task": ...}')` works too (the columns
-- default to a fresh id, the default queue, pending, due now by the database clock), but it wakes
-- no idle worker: they find the job at their next poll. Prefer the function.
--
-- {schema}.alerts (0003): the alert outbox, one row per alert key (`dead:<queue>:<task>`,
-- `stall:<queue>`). Recording an event merges into its key's row, so a flood of dead jobs of one
-- task is one pending alert with a count; dead letters record theirs in the settle statement
-- itself (same transaction as the dead letter).
--
--   key           text PK     the alert key
--   kind, queue, task, job_id, detail   the latest event's (detail cut to ALERT_DETAIL_LIMIT)
--   count         int         events waiting to be delivered; 0 once delivered
--   first_at      float8      the first waiting event (when count went from 0 to 1)
--   last_at       float8      the latest event
--   next_at       float8      earliest (re)try: a claim's lease, a failed delivery's backoff, or
--                             the end of a delivered alert's quiet window
--   attempts      int         failed deliveries since the last success
--   last_error    text        why the last delivery failed
--   sent_at       float8      the last successful delivery
--   token         text        set by a claim; fences the claimer's finish
--
--   Only the primary key: there is one row per key (queues x tasks), few enough for claims and
--   listings to read them all; and with no second index, the count updates of a flood of dead
--   letters can be HOT. Delivered rows (count 0) whose next_at is over a day old are pruned with
--   the kept results.
--
-- {schema}.rates (0003): one row per rate-limit key; `next_free` is when the next grant may be
-- made. A grant is one INSERT ... ON CONFLICT DO UPDATE ... WHERE next_free <= now. A row whose
-- next_free is in the past means the same as no row; rows idle for a day are pruned.
--
-- {schema}.slots (0003): concurrency slots, one row per (key, holder) with its expiry. Acquiring
-- serialises on pg_advisory_xact_lock of the key, taken by a statement of its own first: a holder
-- a concurrent acquire inserts is invisible to a statement whose snapshot predates its commit, so
-- no single counting statement is race-free. It then locks the key's rows FOR UPDATE, which reads
-- heartbeats and releases committed meanwhile; every write to slots locks rows in (key, holder)
-- order, so they never deadlock. Expired rows are dropped by the key's next acquire; those of
-- keys nobody asks for again are pruned a day after they expired.
--
-- {schema}.payload_task(text) (0003): the task name of a wire payload, or NULL, as the core's
-- peek_task reads it; names the dead alert of a job whose task column is NULL (a bare INSERT).


-- migration: 0001_initial

CREATE TABLE {schema}.jobs (
    id            text PRIMARY KEY DEFAULT replace(gen_random_uuid()::text, '-', ''),
    seq           bigint GENERATED ALWAYS AS IDENTITY,
    queue         text NOT NULL DEFAULT 'default',
    task          text,
    state         text NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'running', 'done', 'dead')),
    priority      integer NOT NULL DEFAULT 0,
    run_at        double precision NOT NULL DEFAULT extract(epoch FROM now()),
    attempts      integer NOT NULL DEFAULT 0,
    max_attempts  integer,
    payload       text,
    payload_raw   bytea,
    dedupe_key    text,
    lease_token   text,
    lease_until   double precision,
    last_error    text,
    result        text,
    enqueued_at   double precision NOT NULL DEFAULT extract(epoch FROM now()),
    finished_at   double precision,
    expires_at    double precision,
    CHECK ((payload IS NULL) <> (payload_raw IS NULL)),
    CHECK ((state = 'running') = (lease_token IS NOT NULL))
) WITH (
    -- Room on each page for HOT updates (heartbeats), and a vacuum that keeps up with a table
    -- whose every row is inserted, updated a few times and deleted within seconds.
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

CREATE INDEX jobs_claim_idx ON {schema}.jobs (queue, priority DESC, run_at, seq)
    WHERE state = 'pending';

CREATE INDEX jobs_running_idx ON {schema}.jobs (queue)
    WHERE state = 'running';

CREATE UNIQUE INDEX jobs_dedupe_idx ON {schema}.jobs (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running');

CREATE INDEX jobs_dead_idx ON {schema}.jobs (finished_at DESC)
    WHERE state = 'dead';

CREATE INDEX jobs_expiry_idx ON {schema}.jobs (expires_at)
    WHERE state = 'done';

CREATE TABLE {schema}.paused_queues (
    queue      text PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now()
);

-- Enqueue one job from SQL, for producers that are not taskkit (psql, triggers, other languages):
--
--   SELECT {schema}.enqueue('emails.send', '["a@example.com"]', '{"urgent": true}');
--   SELECT {schema}.enqueue('reports.build', queue => 'reports', run_at => now() + interval '1 hour',
--                           dedupe_key => 'report:42');
--
-- Builds a version-1 wire payload, inserts a pending job and wakes idle workers of its queue with
-- one NOTIFY (delivered when the caller's transaction commits; a rollback enqueues nothing).
-- Returns the new job's id or, when a pending or running job holds `dedupe_key`, that job's id.
-- Times here are the database clock's (run_at defaults to now()).
CREATE FUNCTION {schema}.enqueue(
    task          text,
    args          jsonb DEFAULT '[]',
    kwargs        jsonb DEFAULT '{}',
    queue         text DEFAULT 'default',
    priority      integer DEFAULT 0,
    run_at        timestamptz DEFAULT NULL,
    max_attempts  integer DEFAULT NULL,
    dedupe_key    text DEFAULT NULL,
    timeout       double precision DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    new_id   text := replace(gen_random_uuid()::text, '-', '');
    now_s    double precision := extract(epoch FROM now());
    due      double precision := coalesce(extract(epoch FROM enqueue.run_at), now_s);
    body     jsonb;
    holder   text;
BEGIN
    IF enqueue.task IS NULL OR enqueue.task !~ '^[^\x01-\x20\x7f-\x9f]{1,200}$' THEN
        RAISE EXCEPTION 'taskkit.enqueue: invalid task name %', coalesce(quote_literal(enqueue.task), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.queue IS NULL OR enqueue.queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'taskkit.enqueue: invalid queue name %', coalesce(quote_literal(enqueue.queue), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'use 1-128 characters from A-Z a-z 0-9 _ . : - starting with a letter or digit';
    END IF;
    IF jsonb_typeof(enqueue.args) IS DISTINCT FROM 'array'
       OR jsonb_typeof(enqueue.kwargs) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'taskkit.enqueue: args must be a JSON array and kwargs a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    body := jsonb_build_object(
        'v', 1, 'id', new_id, 'task', enqueue.task, 'args', enqueue.args,
        'kwargs', enqueue.kwargs, 'queue', enqueue.queue, 'priority', coalesce(enqueue.priority, 0),
        'enqueued_at', now_s
    ) || jsonb_strip_nulls(jsonb_build_object(
        'run_at', extract(epoch FROM enqueue.run_at)::double precision,
        'max_attempts', enqueue.max_attempts,
        'timeout', enqueue.timeout,
        'dedupe_key', enqueue.dedupe_key
    ));

    -- A dedupe holder may finish between the failed insert and the lookup: try again then.
    FOR attempt IN 1..5 LOOP
        INSERT INTO {schema}.jobs AS j
            (id, queue, task, state, priority, run_at, max_attempts, payload, dedupe_key, enqueued_at)
        VALUES
            (new_id, enqueue.queue, enqueue.task, 'pending', coalesce(enqueue.priority, 0), due,
             enqueue.max_attempts, body::text, enqueue.dedupe_key, now_s)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            PERFORM pg_notify('{channel}', enqueue.queue);
            RETURN new_id;
        END IF;
        SELECT h.id INTO holder FROM {schema}.jobs h
        WHERE h.dedupe_key = enqueue.dedupe_key AND h.state IN ('pending', 'running');
        IF holder IS NOT NULL THEN
            RETURN holder;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'taskkit.enqueue: could not store the job (dedupe key % keeps changing hands)',
        quote_literal(enqueue.dedupe_key);
END
$$;


-- migration: 0002_cancel_progress
--
-- Cancellation and progress:
--   state 'cancelled'  a pending job cancelled before it ran. It is never claimed (the claim
--                      index covers pending rows only) and holds no dedupe key (jobs_dedupe_idx
--                      covers pending and running rows only). finished_at is when it was
--                      cancelled, expires_at until when get_job still reports it; it is pruned
--                      with the kept results.
--   started_at         when the latest attempt was claimed (every claim sets it).
--   progress           JSON text written by that attempt (every claim clears it); an unindexed
--                      column, so a progress write is a HOT update like a heartbeat.
-- The new columns are nullable without a default: adding them rewrites nothing. The enqueue
-- function needs no change: it inserts pending rows and looks for a key's holder among pending
-- and running rows only, so a cancelled job neither blocks its old dedupe key nor is returned
-- for it.

ALTER TABLE {schema}.jobs
    ADD COLUMN started_at double precision,
    ADD COLUMN progress text;

-- 0001 declared the state CHECK on the column, so PostgreSQL named it jobs_state_check.
ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('pending', 'running', 'done', 'dead', 'cancelled'));

-- Pruning covers cancelled jobs too: both kinds of row expire at expires_at.
DROP INDEX {schema}.jobs_expiry_idx;
CREATE INDEX jobs_expiry_idx ON {schema}.jobs (expires_at)
    WHERE state IN ('done', 'cancelled');


-- migration: 0003_alerts_flow_control
--
-- The alert outbox, shared rate limits and concurrency slots (see the layout above). Only new
-- objects: the jobs table is untouched, so the upgrade is instant on a live schema.

CREATE TABLE {schema}.alerts (
    key         text PRIMARY KEY,
    kind        text NOT NULL,
    queue       text NOT NULL,
    task        text,
    job_id      text,
    detail      text NOT NULL,
    count       integer NOT NULL CHECK (count >= 0),
    first_at    double precision NOT NULL,
    last_at     double precision NOT NULL,
    next_at     double precision NOT NULL,
    attempts    integer NOT NULL DEFAULT 0,
    last_error  text,
    sent_at     double precision,
    token       text
) WITH (fillfactor = 80);  -- a hot key's row is updated by every dead letter: room for HOT

CREATE TABLE {schema}.rates (
    key        text PRIMARY KEY,
    next_free  double precision NOT NULL
) WITH (fillfactor = 80);

CREATE TABLE {schema}.slots (
    key         text NOT NULL,
    holder      text NOT NULL,
    expires_at  double precision NOT NULL,
    PRIMARY KEY (key, holder)
) WITH (fillfactor = 80);

-- Mirrors taskkit.job.peek_task: a JSON object whose "task" is a string of 1-200 printable
-- characters without whitespace (the enqueue function's check); anything else is NULL. Called by
-- settle only for dead jobs whose task column is NULL. The exception block (a subtransaction)
-- turns text that is not JSON, or JSON that jsonb cannot hold (\u0000, too deep), into NULL.
CREATE FUNCTION {schema}.payload_task(payload text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    body  jsonb;
BEGIN
    body := payload::jsonb;
    IF jsonb_typeof(body) = 'object' AND jsonb_typeof(body -> 'task') = 'string'
       AND body ->> 'task' ~ '^[^\x01-\x20\x7f-\x9f]{1,200}$' THEN
        RETURN body ->> 'task';
    END IF;
    RETURN NULL;
EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
    RETURN NULL;
END
$$;
