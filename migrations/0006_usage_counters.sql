-- Usage counters kept by the database itself, in the same transaction as every row change.
--
-- Quota checks used to aggregate an organization's and a project's rows on every admission
-- and activation; under load that scan was most of the time spent holding the org lock.
-- The counters below are maintained by a trigger on `sandboxes`, so they move in the very
-- statement that changes a row and commit or roll back with it: they cannot drift unless
-- someone bypasses triggers, and the scheduler's usage reconcile (store
-- `reconcile_usage`) recounts them from rows periodically, corrects and reports any drift.
--
-- Which statuses count toward what is owned by `differently_core::SandboxStatus`; the
-- server re-syncs `sandbox_status_classes` from it on every `migrate` and recounts when the
-- classification changed. The rows inserted here are only the classification at the time
-- this migration was written.

CREATE TABLE IF NOT EXISTS sandbox_status_classes (
    status  text PRIMARY KEY,
    queued  smallint NOT NULL,  -- 1 if it counts as queued
    active  smallint NOT NULL,  -- counts toward maxActive
    compute smallint NOT NULL,  -- reserves cpu and memory
    disk    smallint NOT NULL,  -- counts toward the disk quota
    slot    smallint NOT NULL   -- holds one of its pool's concurrency slots
);

INSERT INTO sandbox_status_classes (status, queued, active, compute, disk, slot) VALUES
    ('queued',       1, 0, 0, 0, 0),
    ('provisioning', 0, 1, 1, 1, 1),
    ('running',      0, 1, 1, 1, 1),
    ('paused',       0, 1, 1, 1, 1),
    ('stopped',      0, 1, 0, 1, 1),
    ('terminating',  0, 1, 1, 1, 1),
    ('terminated',   0, 0, 0, 0, 0),
    ('failed',       0, 0, 0, 0, 0)
ON CONFLICT (status) DO NOTHING;

-- One row per scope: 'org:<id>', 'project:<id>', 'pool:<name>'. `rank` orders locks: every
-- writer takes org before project before pool, and multi-row writers lock in (rank, scope).
CREATE TABLE IF NOT EXISTS usage_counters (
    scope      text COLLATE "C" PRIMARY KEY,
    rank       smallint NOT NULL,
    queued     bigint NOT NULL DEFAULT 0,
    active     bigint NOT NULL DEFAULT 0,
    cpu        bigint NOT NULL DEFAULT 0,
    memory_mib bigint NOT NULL DEFAULT 0,
    disk_gib   bigint NOT NULL DEFAULT 0,
    slots      bigint NOT NULL DEFAULT 0
);

-- Adds `sign` times the contribution of one row (its status class and sizes) to its org,
-- project and pool counters, in that order.
CREATE OR REPLACE FUNCTION usage_apply(r sandboxes, sign bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c sandbox_status_classes;
BEGIN
    SELECT * INTO c FROM sandbox_status_classes WHERE status = r.status;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sandbox status % has no usage class', r.status;
    END IF;
    IF c.queued + c.active + c.compute + c.disk + c.slot = 0 THEN
        RETURN;
    END IF;
    INSERT INTO usage_counters AS u (scope, rank, queued, active, cpu, memory_mib, disk_gib, slots)
    VALUES ('org:' || r.org_id, 0, sign * c.queued, sign * c.active, sign * c.compute * r.cpu,
            sign * c.compute * r.memory_mib, sign * c.disk * r.disk_gib, 0)
    ON CONFLICT (scope) DO UPDATE SET
        queued = u.queued + EXCLUDED.queued, active = u.active + EXCLUDED.active,
        cpu = u.cpu + EXCLUDED.cpu, memory_mib = u.memory_mib + EXCLUDED.memory_mib,
        disk_gib = u.disk_gib + EXCLUDED.disk_gib;
    INSERT INTO usage_counters AS u (scope, rank, queued, active, cpu, memory_mib, disk_gib, slots)
    VALUES ('project:' || r.project_id, 1, sign * c.queued, sign * c.active, sign * c.compute * r.cpu,
            sign * c.compute * r.memory_mib, sign * c.disk * r.disk_gib, 0)
    ON CONFLICT (scope) DO UPDATE SET
        queued = u.queued + EXCLUDED.queued, active = u.active + EXCLUDED.active,
        cpu = u.cpu + EXCLUDED.cpu, memory_mib = u.memory_mib + EXCLUDED.memory_mib,
        disk_gib = u.disk_gib + EXCLUDED.disk_gib;
    IF r.pool IS NOT NULL AND c.slot <> 0 THEN
        INSERT INTO usage_counters AS u (scope, rank, slots)
        VALUES ('pool:' || r.pool, 2, sign * c.slot)
        ON CONFLICT (scope) DO UPDATE SET slots = u.slots + EXCLUDED.slots;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION sandboxes_usage_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND OLD.status = NEW.status
       AND OLD.pool IS NOT DISTINCT FROM NEW.pool
       AND OLD.cpu = NEW.cpu AND OLD.memory_mib = NEW.memory_mib AND OLD.disk_gib = NEW.disk_gib
       AND OLD.org_id = NEW.org_id AND OLD.project_id = NEW.project_id THEN
        -- Nothing counted changed (a reason, a deadline, the document): touch no counter,
        -- so such writes take no counter lock.
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM usage_apply(OLD, -1);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM usage_apply(NEW, 1);
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS sandboxes_usage ON sandboxes;
CREATE TRIGGER sandboxes_usage AFTER INSERT OR UPDATE OR DELETE ON sandboxes
    FOR EACH ROW EXECUTE FUNCTION sandboxes_usage_trigger();

-- Rows that existed before this migration.
INSERT INTO usage_counters (scope, rank, queued, active, cpu, memory_mib, disk_gib, slots)
SELECT 'org:' || s.org_id, 0, sum(c.queued), sum(c.active), sum(c.compute * s.cpu),
       sum(c.compute * s.memory_mib), sum(c.disk * s.disk_gib), 0
FROM sandboxes s JOIN sandbox_status_classes c ON c.status = s.status GROUP BY s.org_id
ON CONFLICT (scope) DO NOTHING;
INSERT INTO usage_counters (scope, rank, queued, active, cpu, memory_mib, disk_gib, slots)
SELECT 'project:' || s.project_id, 1, sum(c.queued), sum(c.active), sum(c.compute * s.cpu),
       sum(c.compute * s.memory_mib), sum(c.disk * s.disk_gib), 0
FROM sandboxes s JOIN sandbox_status_classes c ON c.status = s.status GROUP BY s.project_id
ON CONFLICT (scope) DO NOTHING;
INSERT INTO usage_counters (scope, rank, slots)
SELECT 'pool:' || s.pool, 2, sum(c.slot)
FROM sandboxes s JOIN sandbox_status_classes c ON c.status = s.status
WHERE s.pool IS NOT NULL GROUP BY s.pool
ON CONFLICT (scope) DO NOTHING;
