-- Differently schema, version 0003: lifecycle operations, snapshots, sandbox activity.
-- No foreign keys to sandboxes or organizations: these rows outlive project deletion
-- (snapshots) or are history (operations); the store keeps them consistent.

-- One row per lifecycle call executed by a pool's workers (pause, resume, stop, start,
-- snapshot, deletesnapshot, exposeport, renew). The partial unique index is the 409: at most
-- one exclusive operation is pending per sandbox.
CREATE TABLE sandbox_ops (
    id         text COLLATE "C" PRIMARY KEY,
    sandbox_id text COLLATE "C" NOT NULL,
    org_id     text NOT NULL,
    kind       text NOT NULL,
    exclusive  boolean NOT NULL,
    state      text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    doc        jsonb NOT NULL
);
CREATE UNIQUE INDEX sandbox_ops_one_exclusive_idx ON sandbox_ops (sandbox_id)
    WHERE state = 'pending' AND exclusive;
CREATE INDEX sandbox_ops_pending_idx ON sandbox_ops (updated_at) WHERE state = 'pending';
CREATE INDEX sandbox_ops_sandbox_idx ON sandbox_ops (sandbox_id);

CREATE TABLE snapshots (
    id         text COLLATE "C" PRIMARY KEY,
    org_id     text NOT NULL,
    project_id text NOT NULL,
    sandbox_id text COLLATE "C" NOT NULL,
    pool       text NOT NULL,
    status     text NOT NULL,
    created_at timestamptz NOT NULL,
    doc        jsonb NOT NULL
);
CREATE INDEX snapshots_org_idx ON snapshots (org_id, id);

-- Last data-plane call (exec, files, ports, keepalive) per sandbox, for the idle sweep.
CREATE TABLE sandbox_activity (
    sandbox_id       text COLLATE "C" PRIMARY KEY,
    last_activity_at timestamptz NOT NULL
);
