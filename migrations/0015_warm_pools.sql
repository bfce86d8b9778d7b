-- Warm pools: per pool, warm classes (kinds of instance kept created ahead of time) and the
-- instances themselves. A create matching a class claims the oldest ready instance of it in
-- its admission transaction: that transaction deletes the warm row and inserts the sandbox
-- row under the same id (the id the backend instance is tagged with), so an instance is
-- claimed at most once by construction.

-- The document an operator puts per pool (`differently_core::warm::WarmClasses`).
CREATE TABLE warm_classes (
    pool       text COLLATE "C" PRIMARY KEY,
    classes    jsonb NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE TABLE warm_instances (
    -- A sandbox id: the claiming sandbox row takes it.
    id          text COLLATE "C" PRIMARY KEY,
    pool        text COLLATE "C" NOT NULL,
    class       text COLLATE "C" NOT NULL,
    state       text NOT NULL CHECK (state IN ('creating', 'ready', 'retiring')),
    -- The backend's own id, set when the instance is ready.
    backend_ref text,
    created_at  timestamptz NOT NULL,
    ready_at    timestamptz,
    -- How many times the refill leader began its create.
    attempts    integer NOT NULL DEFAULT 1,
    -- A claimable row always names its backend instance.
    CHECK (state <> 'ready' OR (backend_ref IS NOT NULL AND ready_at IS NOT NULL))
);
-- The claim: oldest ready instance of (pool, class); and the counts per pool.
CREATE INDEX warm_instances_claim_idx ON warm_instances (pool, class, state, ready_at);
