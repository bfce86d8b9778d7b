-- Differently schema, version 0004: tamper-evident audit chains, checkpoints, sealed secrets.
--
-- Every record written from now on belongs to a chain (its organization's id, or
-- 'installation') at a gapless position chain_seq, and carries prev_hash and
-- hash = HMAC-SHA256(audit key, prev_hash || canonical record). The key is server
-- configuration and is never stored here. Records written before this version keep
-- chain = NULL: they cannot be verified and `verify` counts them as unchained.

ALTER TABLE audit_events
    ADD COLUMN chain      text,
    ADD COLUMN chain_seq  bigint,
    ADD COLUMN project_id text,
    ADD COLUMN outcome    text NOT NULL DEFAULT 'ok',
    ADD COLUMN request_id text,
    ADD COLUMN prev_hash  text,
    ADD COLUMN hash       text;

-- One position per chain: two writers can never both append record n.
CREATE UNIQUE INDEX audit_events_chain_idx ON audit_events (chain, chain_seq)
    WHERE chain IS NOT NULL;
CREATE INDEX audit_events_project_idx ON audit_events (project_id, seq)
    WHERE project_id IS NOT NULL;
-- Chained rows are complete.
ALTER TABLE audit_events ADD CONSTRAINT audit_events_chained_complete CHECK (
    chain IS NULL
    OR (chain_seq >= 1 AND prev_hash IS NOT NULL AND hash IS NOT NULL)
);

-- Signed snapshots of every chain's head, so a truncated tail is detectable. Checkpoints
-- chain among themselves the same way (seq gapless, prev_hash, hash).
CREATE TABLE audit_checkpoints (
    seq       bigint PRIMARY KEY CHECK (seq >= 1),
    at        timestamptz NOT NULL,
    heads     jsonb NOT NULL,
    prev_hash text NOT NULL,
    hash      text NOT NULL
);

-- History is append-only in the database itself, whatever the server does: UPDATE,
-- DELETE and TRUNCATE of audit rows and checkpoints raise.
CREATE FUNCTION dly_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit history is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER audit_events_append_only
    BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION dly_audit_append_only();
CREATE TRIGGER audit_events_no_truncate
    BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION dly_audit_append_only();
CREATE TRIGGER audit_checkpoints_append_only
    BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION dly_audit_append_only();
CREATE TRIGGER audit_checkpoints_no_truncate
    BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION dly_audit_append_only();

-- Provider credentials stored in Differently: AES-256-GCM under a key outside the database,
-- the name bound as associated data. Never the value; its fingerprint and who changed it.
CREATE TABLE secrets (
    name        text PRIMARY KEY,
    sealed      bytea NOT NULL,
    fingerprint text NOT NULL,
    updated_by  text NOT NULL,
    updated_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL
);
