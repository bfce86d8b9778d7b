-- Webhooks (issue #25): per-project endpoints receiving public events, signed with a secret
-- sealed under the process's secrets key (never stored in the clear), and their delivery log.
CREATE TABLE webhooks (
    id text PRIMARY KEY,
    org_id text NOT NULL REFERENCES organizations (id),
    project_id text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    url text NOT NULL,
    event_types jsonb NOT NULL DEFAULT '[]',
    description text,
    enabled boolean NOT NULL DEFAULT true,
    disabled_reason text,
    consecutive_failures integer NOT NULL DEFAULT 0,
    failing_since timestamptz,
    secret_sealed bytea NOT NULL,
    previous_secret_sealed bytea,
    previous_secret_expires_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX webhooks_org_idx ON webhooks (org_id, id);
CREATE INDEX webhooks_project_idx ON webhooks (project_id) WHERE enabled;

-- One row per (webhook, event): the unique pair makes a re-read event a no-op, so the bus
-- consumer that creates them may deliver at least once.
CREATE TABLE webhook_deliveries (
    id text PRIMARY KEY,
    webhook_id text NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    org_id text NOT NULL,
    project_id text NOT NULL,
    event_id text NOT NULL,
    event_type text NOT NULL,
    body text NOT NULL,
    status text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    lease_until timestamptz,
    response_code integer,
    latency_ms bigint,
    last_error text,
    response_body text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    delivered_at timestamptz,
    UNIQUE (webhook_id, event_id)
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_log_idx ON webhook_deliveries (webhook_id, id);
