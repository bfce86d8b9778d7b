-- Differently schema, version 0001.
-- Each resource is a JSONB doc; the columns needed for locking, filtering and ordering are
-- promoted next to it and kept in step by the store (the doc is the serialized core type).

CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- Installation-wide values, e.g. the installation id (inst_<ulid>), created once.
CREATE TABLE meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

-- Row lock target for admission and activation.
CREATE TABLE organizations (
    id         text PRIMARY KEY,
    name       text NOT NULL,
    doc        jsonb NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE TABLE projects (
    id         text PRIMARY KEY,
    org_id     text NOT NULL REFERENCES organizations (id),
    name       text NOT NULL,
    doc        jsonb NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX projects_org_id_idx ON projects (org_id);

-- Row lock target for concurrency-capped activation (inserted on demand).
CREATE TABLE pools (
    name text PRIMARY KEY
);

-- Ids are ULIDs: byte order (COLLATE "C") is creation order whatever the server's locale.
-- The queue is this table: a queued sandbox is a row with status 'queued' and a next_attempt_at.
CREATE TABLE sandboxes (
    id              text COLLATE "C" PRIMARY KEY,
    org_id          text NOT NULL REFERENCES organizations (id),
    project_id      text NOT NULL REFERENCES projects (id),
    status          text NOT NULL,
    status_version  bigint NOT NULL,
    pool            text,
    backend_ref     text,
    idempotency_key text,
    request_hash    text NOT NULL,
    attempts        integer NOT NULL,
    priority        integer NOT NULL,
    cpu             bigint NOT NULL,
    memory_mib      bigint NOT NULL,
    disk_gib        bigint NOT NULL,
    next_attempt_at timestamptz NOT NULL,
    expires_at      timestamptz,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    doc             jsonb NOT NULL
);
CREATE INDEX sandboxes_queued_idx ON sandboxes (next_attempt_at) WHERE status = 'queued';
CREATE UNIQUE INDEX sandboxes_idempotency_idx ON sandboxes (project_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX sandboxes_status_updated_idx ON sandboxes (status, updated_at);
CREATE INDEX sandboxes_org_status_idx ON sandboxes (org_id, status);
CREATE INDEX sandboxes_project_idx ON sandboxes (project_id, id);
CREATE INDEX sandboxes_pool_status_idx ON sandboxes (pool, status) WHERE pool IS NOT NULL;
CREATE INDEX sandboxes_expires_idx ON sandboxes (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX sandboxes_labels_idx ON sandboxes USING gin ((doc -> 'spec' -> 'labels') jsonb_path_ops);

-- Append-only audit log.
CREATE TABLE audit_events (
    seq      bigserial PRIMARY KEY,
    org_id   text,
    actor    text NOT NULL,
    action   text NOT NULL,
    resource text NOT NULL,
    at       timestamptz NOT NULL,
    detail   jsonb NOT NULL
);
CREATE INDEX audit_events_org_idx ON audit_events (org_id, seq);
CREATE INDEX audit_events_resource_idx ON audit_events (resource, seq);
CREATE INDEX audit_events_action_idx ON audit_events (action);
