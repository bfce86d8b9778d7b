-- Placement: policies per level, the pool registry, the fleet-wide pool health view, and
-- the stored placement explanation of each sandbox.

CREATE TABLE IF NOT EXISTS policies (
    scope      text PRIMARY KEY,          -- 'global', 'org:<id>', 'project:<id>'
    doc        jsonb NOT NULL,
    updated_at timestamptz NOT NULL
);

ALTER TABLE pools ADD COLUMN IF NOT EXISTS doc jsonb;
ALTER TABLE pools ADD COLUMN IF NOT EXISTS source text;

CREATE TABLE IF NOT EXISTS pool_health (
    name       text PRIMARY KEY,
    doc        jsonb NOT NULL,
    checked_at timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS placements (
    sandbox_id text COLLATE "C" PRIMARY KEY REFERENCES sandboxes (id) ON DELETE CASCADE,
    doc        jsonb NOT NULL,
    decided_at timestamptz NOT NULL
);
