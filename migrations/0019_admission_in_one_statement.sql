-- A lone admission (its row, its audit records, its placement) in one autocommit statement
-- (issue #47).
--
-- On the admission lane a create is a transaction of about seven round trips: BEGIN, the
-- org's admission lock, the quotas and counters, the earlier row under its Idempotency-Key,
-- the row's insert with the audit head's lock, the records, the placement, COMMIT. A create
-- with nothing to group with now reads all of that unlocked in one statement, decides in Rust
-- exactly as the lane would, and sends the decided row and its chained records in one call
-- of `differently_admit_sandbox`. The call takes the lane's locks in the lane's order and
-- writes only if what the decision rested on still holds; otherwise it writes nothing and
-- says why, and the create takes the lane.
--
-- What a decision rests on, and the guard for each, checked after the locks:
-- * the project belongs to the org: re-read;
-- * no row yet under its Idempotency-Key: re-checked (the lane then replays it);
-- * both stored quotas: their rows' `xmin` (a quota write gives a new one; no row stays no
--   row);
-- * the org's and project's usage counters: no field higher than read. An admission's
--   decision is monotone in usage (limits are upper bounds, "nothing waits" is `queued = 0`):
--   with less in use, an admitted create is still within its limits and a placed one still
--   fits. A create decided to wait could have been placed on the lower figures; it waits for
--   the leader, as a create admitted a moment before a termination committed would;
-- * the chain's head is still `g_prev_seq`, locked `FOR UPDATE`.
-- A refusal, a replay, or an unknown project needs no call: the unlocked read is a committed
-- state, and it writes nothing.

-- Inserts the row `r_*` (arrays of one, as the lane's insert binds them), appends the records
-- `a_*` (in chain order, all on one chain) and writes the placement `p_doc` (NULL: none), if
-- the guards `g_*` hold. Returns 'done', or 'moved:<what>' with nothing written.
CREATE FUNCTION differently_admit_sandbox(
    r_id text[], r_org_id text[], r_project_id text[], r_status text[],
    r_status_version bigint[], r_pool text[], r_backend_ref text[], r_idempotency_key text[],
    r_request_hash text[], r_attempts int[], r_priority int[], r_cpu bigint[],
    r_memory_mib bigint[], r_disk_gib bigint[], r_next_attempt_at timestamptz[],
    r_expires_at timestamptz[], r_created_at timestamptz[], r_updated_at timestamptz[],
    r_doc jsonb[], r_env_sealed bytea[],
    a_chain text[], a_chain_seq bigint[], a_org_id text[], a_project_id text[], a_actor text[],
    a_action text[], a_resource text[], a_outcome text[], a_request_id text[],
    a_at timestamptz[], a_detail jsonb[], a_prev_hash text[], a_hash text[], a_key_id text[],
    g_lock_space int, g_places boolean, g_org_scope text, g_prj_scope text,
    g_org_quota_xmin text, g_prj_quota_xmin text, g_org_usage bigint[], g_prj_usage bigint[],
    g_prev_seq bigint,
    p_doc jsonb, p_at timestamptz)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_org text := r_org_id[1];
    v_project text := r_project_id[1];
    v_key text := r_idempotency_key[1];
    v_chain text := a_chain[1];
    v_last int := array_length(a_chain, 1);
    v_found text;
    v_seq bigint;
    v_usage bigint[];
BEGIN
    IF array_length(r_id, 1) IS DISTINCT FROM 1 OR v_last IS NULL THEN
        RAISE EXCEPTION 'differently_admit_sandbox takes one row and at least one record';
    END IF;
    -- The lane's locks, in its order (`locks::lock_org_admissions`): the org's admission
    -- lock, then the org row, which a create that also places takes as activations do.
    PERFORM pg_advisory_xact_lock(g_lock_space, hashtext(v_org));
    IF g_places THEN
        PERFORM 1 FROM organizations o WHERE o.id = v_org FOR NO KEY UPDATE;
    ELSE
        PERFORM 1 FROM organizations o WHERE o.id = v_org FOR KEY SHARE;
    END IF;
    IF NOT FOUND THEN
        RETURN 'moved:org';
    END IF;
    SELECT p.org_id INTO v_found FROM projects p WHERE p.id = v_project;
    IF v_found IS DISTINCT FROM v_org THEN
        RETURN 'moved:project';
    END IF;
    IF v_key IS NOT NULL AND EXISTS (SELECT 1 FROM sandboxes s
                                     WHERE s.project_id = v_project
                                       AND s.idempotency_key = v_key) THEN
        RETURN 'moved:replay';
    END IF;
    IF (SELECT q.xmin::text FROM quotas q WHERE q.scope = g_org_scope)
           IS DISTINCT FROM g_org_quota_xmin
       OR (SELECT q.xmin::text FROM quotas q WHERE q.scope = g_prj_scope)
           IS DISTINCT FROM g_prj_quota_xmin THEN
        RETURN 'moved:quota';
    END IF;
    FOR v_found IN SELECT unnest(ARRAY[g_org_scope, g_prj_scope]) LOOP
        SELECT ARRAY[u.queued, u.active, u.cpu, u.memory_mib, u.disk_gib] INTO v_usage
        FROM usage_counters u WHERE u.scope = v_found;
        IF v_usage IS NULL THEN
            v_usage := ARRAY[0, 0, 0, 0, 0]::bigint[];
        END IF;
        IF EXISTS (SELECT 1
                   FROM unnest(v_usage, CASE WHEN v_found = g_org_scope THEN g_org_usage
                                             ELSE g_prj_usage END) AS u(now_, seen)
                   WHERE seen IS NULL OR now_ > seen) THEN
            RETURN 'moved:usage';
        END IF;
    END LOOP;
    SELECT h.chain_seq INTO v_seq FROM audit_heads h WHERE h.chain = v_chain FOR UPDATE;
    IF NOT FOUND OR v_seq <> g_prev_seq THEN
        RETURN 'moved:head';
    END IF;
    INSERT INTO sandboxes (id, org_id, project_id, status, status_version, pool,
        backend_ref, idempotency_key, request_hash, attempts, priority, cpu, memory_mib,
        disk_gib, next_attempt_at, expires_at, created_at, updated_at, doc, env_sealed)
    SELECT * FROM UNNEST(r_id, r_org_id, r_project_id, r_status, r_status_version, r_pool,
        r_backend_ref, r_idempotency_key, r_request_hash, r_attempts, r_priority, r_cpu,
        r_memory_mib, r_disk_gib, r_next_attempt_at, r_expires_at, r_created_at,
        r_updated_at, r_doc, r_env_sealed);
    INSERT INTO audit_events (chain, chain_seq, org_id, project_id, actor, action, resource,
        outcome, request_id, at, detail, prev_hash, hash, key_id)
    SELECT * FROM UNNEST(a_chain, a_chain_seq, a_org_id, a_project_id, a_actor, a_action,
        a_resource, a_outcome, a_request_id, a_at, a_detail, a_prev_hash, a_hash, a_key_id);
    UPDATE audit_heads SET chain_seq = a_chain_seq[v_last], hash = a_hash[v_last]
    WHERE chain = v_chain;
    IF p_doc IS NOT NULL THEN
        -- After the row's insert (the explanation references its row).
        INSERT INTO placements (sandbox_id, doc, decided_at) VALUES (r_id[1], p_doc, p_at)
        ON CONFLICT (sandbox_id) DO UPDATE SET doc = EXCLUDED.doc,
            decided_at = EXCLUDED.decided_at;
    END IF;
    RETURN 'done';
END
$$;
