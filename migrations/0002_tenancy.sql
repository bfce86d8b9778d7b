-- Differently schema, version 0002: tenancy (organization status, API keys, quotas).
-- Name uniqueness (organization names installation-wide, project names within an
-- organization) is enforced by the store under locks, not by unique indexes, so that
-- bootstrap tenants created before this version (`ensure_tenant`, keyed by id) never make
-- this migration fail.

-- Organization status promoted next to the doc; documents written before 0002 lack it.
ALTER TABLE organizations ADD COLUMN status text NOT NULL DEFAULT 'active';
UPDATE organizations SET doc = doc || '{"status": "active"}'::jsonb WHERE NOT doc ? 'status';
CREATE INDEX organizations_name_idx ON organizations (name);
CREATE INDEX projects_org_name_idx ON projects (org_id, name);

-- API key records. The hash has its own column because the doc (the serialized
-- `ApiKeyRecord`) never contains it.
CREATE TABLE api_keys (
    id         text COLLATE "C" PRIMARY KEY,
    org_id     text NOT NULL REFERENCES organizations (id),
    project_id text REFERENCES projects (id),
    doc        jsonb NOT NULL,
    hash       text NOT NULL,
    revoked_at timestamptz,
    expires_at timestamptz,
    created_at timestamptz NOT NULL
);
CREATE INDEX api_keys_org_idx ON api_keys (org_id, id);
CREATE INDEX api_keys_project_idx ON api_keys (project_id) WHERE project_id IS NOT NULL;
CREATE INDEX api_keys_hash_idx ON api_keys (hash);

-- Stored quotas keyed by `QuotaScope::key()` (`org:<id>` or `project:<id>`).
CREATE TABLE quotas (
    scope text PRIMARY KEY,
    doc   jsonb NOT NULL
);
