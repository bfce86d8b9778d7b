-- Idempotency-Key for the creating POSTs other than sandbox create (which keeps its key on
-- the sandbox row, replayed inside its admission transaction): the first request claims the
-- key (`pending`), and its answer is kept (`done`) so that a retry gets the same answer
-- instead of a second organization, key or snapshot. One key per API key and route.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    owner        text NOT NULL,          -- the API key that sent the request
    route        text NOT NULL,          -- e.g. 'POST /v1/keys'
    key          text NOT NULL,          -- the Idempotency-Key header
    request_hash text NOT NULL,          -- SHA-256 of the route and the body
    state        text NOT NULL CHECK (state IN ('pending', 'done')),
    status       smallint,               -- the answer, once done
    body         jsonb,
    claimed_at   timestamptz NOT NULL,
    PRIMARY KEY (owner, route, key)
);

CREATE INDEX IF NOT EXISTS idempotency_keys_claimed_idx ON idempotency_keys (claimed_at);
