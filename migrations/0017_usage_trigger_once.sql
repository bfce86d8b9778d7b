-- The usage trigger of 0006, leaner (issue #47). Same counters, same transaction, same lock
-- order; fewer statements at COMMIT:
--
-- * One statement per row change that moves a counter, not one per scope. The old body ran
--   `usage_add` for the org, the project and the pool on every firing (three statements),
--   even when the change counted the same and every call returned at once. A session
--   (insert, running, terminating, terminated) ran 12 of them; now it runs 2 (the insert and
--   the end), and the changes in between run none.
-- * No firing at all for an update that changes no column the counters depend on (a reason,
--   a deadline, activity): the update trigger's WHEN is evaluated when the row changes, so
--   such updates queue nothing for COMMIT.
--
-- The deltas of the old and the new scopes are summed per scope, so a change that keeps its
-- org, project or pool moves each of them once, and the rows are locked in (rank, scope)
-- order, the order `usage_counters::lock_in_order` and the audit append take them in.
CREATE OR REPLACE FUNCTION sandboxes_usage_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    o sandbox_status_classes := ROW('', 0, 0, 0, 0, 0);
    n sandbox_status_classes := ROW('', 0, 0, 0, 0, 0);
    ocpu bigint := 0; omem bigint := 0; odisk bigint := 0;
    ncpu bigint := 0; nmem bigint := 0; ndisk bigint := 0;
    oorg text; oproject text; opool text;
    norg text; nproject text; npool text;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        o := usage_class(OLD.status);
        ocpu := o.compute * OLD.cpu; omem := o.compute * OLD.memory_mib;
        odisk := o.disk * OLD.disk_gib;
        oorg := OLD.org_id; oproject := OLD.project_id; opool := OLD.pool;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        n := usage_class(NEW.status);
        ncpu := n.compute * NEW.cpu; nmem := n.compute * NEW.memory_mib;
        ndisk := n.disk * NEW.disk_gib;
        norg := NEW.org_id; nproject := NEW.project_id; npool := NEW.pool;
    END IF;
    -- Counts the same in the same scopes (provisioning -> running): no statement, no lock.
    IF oorg IS NOT DISTINCT FROM norg AND oproject IS NOT DISTINCT FROM nproject
       AND opool IS NOT DISTINCT FROM npool
       AND o.queued = n.queued AND o.active = n.active AND ocpu = ncpu AND omem = nmem
       AND odisk = ndisk AND o.slot = n.slot THEN
        RETURN NULL;
    END IF;
    INSERT INTO usage_counters AS u (scope, rank, queued, active, cpu, memory_mib, disk_gib, slots)
    SELECT d.scope, d.rank, sum(d.q), sum(d.a), sum(d.c), sum(d.m), sum(d.k), sum(d.s)
    FROM (VALUES
        ('org:' || oorg, 0::smallint, -o.queued::bigint, -o.active::bigint, -ocpu, -omem, -odisk, 0::bigint),
        ('project:' || oproject, 1::smallint, -o.queued, -o.active, -ocpu, -omem, -odisk, 0),
        ('org:' || norg, 0::smallint, n.queued, n.active, ncpu, nmem, ndisk, 0),
        ('project:' || nproject, 1::smallint, n.queued, n.active, ncpu, nmem, ndisk, 0),
        ('pool:' || opool, 2::smallint, 0, 0, 0, 0, 0, -o.slot),
        ('pool:' || npool, 2::smallint, 0, 0, 0, 0, 0, n.slot)
    ) AS d(scope, rank, q, a, c, m, k, s)
    WHERE d.scope IS NOT NULL
    GROUP BY d.scope, d.rank
    HAVING sum(d.q) <> 0 OR sum(d.a) <> 0 OR sum(d.c) <> 0 OR sum(d.m) <> 0 OR sum(d.k) <> 0
        OR sum(d.s) <> 0
    ORDER BY d.rank, d.scope COLLATE "C"
    ON CONFLICT (scope) DO UPDATE SET
        queued = u.queued + EXCLUDED.queued, active = u.active + EXCLUDED.active,
        cpu = u.cpu + EXCLUDED.cpu, memory_mib = u.memory_mib + EXCLUDED.memory_mib,
        disk_gib = u.disk_gib + EXCLUDED.disk_gib, slots = u.slots + EXCLUDED.slots;
    RETURN NULL;
END;
$$;

-- Still deferred to COMMIT, for the reason 0006 gives (the counters are hot rows, locked for
-- the commit only). Inserts and deletes always count; an update only when it changes a
-- column the counters read.
DROP TRIGGER IF EXISTS sandboxes_usage ON sandboxes;
CREATE CONSTRAINT TRIGGER sandboxes_usage AFTER INSERT OR DELETE ON sandboxes
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION sandboxes_usage_trigger();
CREATE CONSTRAINT TRIGGER sandboxes_usage_update AFTER UPDATE ON sandboxes
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN ((OLD.status, OLD.pool, OLD.org_id, OLD.project_id, OLD.cpu, OLD.memory_mib, OLD.disk_gib)
          IS DISTINCT FROM
          (NEW.status, NEW.pool, NEW.org_id, NEW.project_id, NEW.cpu, NEW.memory_mib, NEW.disk_gib))
    EXECUTE FUNCTION sandboxes_usage_trigger();
