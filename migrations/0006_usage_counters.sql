-- Usage counters kept by the database itself, in the same transaction as every row change.
-- (Lock order: organization row, pool row, sandbox rows, audit head; the counters, moved at
-- commit, come last: org, then project, then pool.)
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

-- Adds deltas to one counter; a zero delta touches (and locks) nothing.
CREATE OR REPLACE FUNCTION usage_add(
    k text, r smallint, dq bigint, da bigint, dc bigint, dm bigint, dd bigint, ds bigint
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF dq = 0 AND da = 0 AND dc = 0 AND dm = 0 AND dd = 0 AND ds = 0 THEN
        RETURN;
    END IF;
    INSERT INTO usage_counters AS u (scope, rank, queued, active, cpu, memory_mib, disk_gib, slots)
    VALUES (k, r, dq, da, dc, dm, dd, ds)
    ON CONFLICT (scope) DO UPDATE SET
        queued = u.queued + EXCLUDED.queued, active = u.active + EXCLUDED.active,
        cpu = u.cpu + EXCLUDED.cpu, memory_mib = u.memory_mib + EXCLUDED.memory_mib,
        disk_gib = u.disk_gib + EXCLUDED.disk_gib, slots = u.slots + EXCLUDED.slots;
END;
$$;

-- The class of a status; an unknown status is an error, never silently uncounted.
CREATE OR REPLACE FUNCTION usage_class(st text) RETURNS sandbox_status_classes
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c sandbox_status_classes;
BEGIN
    SELECT * INTO c FROM sandbox_status_classes WHERE status = st;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sandbox status % has no usage class', st;
    END IF;
    RETURN c;
END;
$$;

-- Moves the counters by the difference a row change makes: org, then project, then pool
-- (the lock order). A change that counts the same before and after (provisioning ->
-- running, a reason, a deadline) touches no counter and so takes no counter lock.
CREATE OR REPLACE FUNCTION sandboxes_usage_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    o sandbox_status_classes := ROW('', 0, 0, 0, 0, 0);
    n sandbox_status_classes := ROW('', 0, 0, 0, 0, 0);
    ocpu bigint := 0; omem bigint := 0; odisk bigint := 0;
    ncpu bigint := 0; nmem bigint := 0; ndisk bigint := 0;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        o := usage_class(OLD.status);
        ocpu := OLD.cpu; omem := OLD.memory_mib; odisk := OLD.disk_gib;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        n := usage_class(NEW.status);
        ncpu := NEW.cpu; nmem := NEW.memory_mib; ndisk := NEW.disk_gib;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.org_id = NEW.org_id AND OLD.project_id = NEW.project_id THEN
        PERFORM usage_add('org:' || NEW.org_id, 0::smallint, n.queued - o.queued,
            n.active - o.active, n.compute * ncpu - o.compute * ocpu,
            n.compute * nmem - o.compute * omem, n.disk * ndisk - o.disk * odisk, 0);
        PERFORM usage_add('project:' || NEW.project_id, 1::smallint, n.queued - o.queued,
            n.active - o.active, n.compute * ncpu - o.compute * ocpu,
            n.compute * nmem - o.compute * omem, n.disk * ndisk - o.disk * odisk, 0);
    ELSE
        IF TG_OP <> 'INSERT' THEN
            PERFORM usage_add('org:' || OLD.org_id, 0::smallint, -o.queued, -o.active,
                -o.compute * ocpu, -o.compute * omem, -o.disk * odisk, 0);
            PERFORM usage_add('project:' || OLD.project_id, 1::smallint, -o.queued, -o.active,
                -o.compute * ocpu, -o.compute * omem, -o.disk * odisk, 0);
        END IF;
        IF TG_OP <> 'DELETE' THEN
            PERFORM usage_add('org:' || NEW.org_id, 0::smallint, n.queued, n.active,
                n.compute * ncpu, n.compute * nmem, n.disk * ndisk, 0);
            PERFORM usage_add('project:' || NEW.project_id, 1::smallint, n.queued, n.active,
                n.compute * ncpu, n.compute * nmem, n.disk * ndisk, 0);
        END IF;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.pool IS NOT DISTINCT FROM NEW.pool THEN
        IF NEW.pool IS NOT NULL THEN
            PERFORM usage_add('pool:' || NEW.pool, 2::smallint, 0, 0, 0, 0, 0, n.slot - o.slot);
        END IF;
    ELSE
        IF TG_OP <> 'INSERT' AND OLD.pool IS NOT NULL THEN
            PERFORM usage_add('pool:' || OLD.pool, 2::smallint, 0, 0, 0, 0, 0, -o.slot);
        END IF;
        IF TG_OP <> 'DELETE' AND NEW.pool IS NOT NULL THEN
            PERFORM usage_add('pool:' || NEW.pool, 2::smallint, 0, 0, 0, 0, 0, n.slot);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- Deferred to commit: the counters are hot rows (every admission, activation and end of an
-- organization's sandboxes moves its org counter), so they are locked for the commit only,
-- not from the row change through the rest of the transaction. Everything still happens in
-- the committing transaction. Admission and activation read them under the organization's
-- row lock, which every other admission and activation holds until its commit (counters
-- included), so a check never misses another check's increase; a concurrent decrease not yet
-- committed only makes a check conservative, as counting rows did.
DROP TRIGGER IF EXISTS sandboxes_usage ON sandboxes;
CREATE CONSTRAINT TRIGGER sandboxes_usage AFTER INSERT OR UPDATE OR DELETE ON sandboxes
    DEFERRABLE INITIALLY DEFERRED
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
