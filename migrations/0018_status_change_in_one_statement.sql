-- A sandbox's status change and its audit record in one autocommit statement (issue #47).
--
-- A change on the group-commit lane is a transaction of four round trips: BEGIN, lock the row,
-- write it with the audit record, COMMIT. A change with nothing to group with (the usual case
-- on a quiet system) now reads the row and its chain head, decides in Rust, and sends
-- everything in one call of `differently_change_sandbox`: the row is written, the head
-- advanced and the record inserted only if neither moved since the read (compare and swap).
-- A miss writes nothing and answers what it found, for one more try. (The read joins the
-- row to its chain's head as `org_id || chain_suffix(id)`, the suffix computed in Rust: a
-- SQL function for the whole chain was not inlined, because `convert_to` is only stable, and
-- cost 0.2 ms a call.)
--
-- Guards: the row's `xmin` (the transaction that wrote its current version: any update of the
-- row, a status change, a TTL extension or an env sealing, gives it a new one), and the head's
-- `chain_seq`. Both are locked in the order every writer takes them (the row, then the head),
-- and re-read after the lock, so what a miss answers is current.

-- Writes the sandbox row `p_*` and appends the audit record `a_*` onto chain `a_chain`, if the
-- row is still the version `p_xmin` and the chain's head is still `p_prev_seq`.
--
-- o_outcome: `done` (o_seq is the record's global seq, o_xmin the row's new version);
-- `row_moved` or `head_moved` (nothing written; o_doc, o_env_sealed and o_xmin are the row
-- now, o_head_seq and o_head_hash the chain's head now); `gone` (no such row); `no_head` (the
-- chain has no head row yet: its first record takes the locking path).
CREATE FUNCTION differently_change_sandbox(
    p_id text, p_xmin text, p_prev_seq bigint,
    p_status text, p_status_version bigint, p_pool text, p_backend_ref text, p_attempts int,
    p_priority int, p_cpu bigint, p_memory_mib bigint, p_disk_gib bigint,
    p_expires_at timestamptz, p_updated_at timestamptz, p_doc jsonb, p_env_sealed bytea,
    a_chain text, a_chain_seq bigint, a_org_id text, a_project_id text, a_actor text,
    a_action text, a_resource text, a_outcome text, a_request_id text, a_at timestamptz,
    a_detail jsonb, a_prev_hash text, a_hash text, a_key_id text)
RETURNS TABLE (o_outcome text, o_seq bigint, o_xmin text, o_doc jsonb, o_env_sealed bytea,
               o_head_seq bigint, o_head_hash text)
LANGUAGE plpgsql AS $$
DECLARE
    cur_doc jsonb;
    cur_env bytea;
    cur_xmin text;
    head_seq bigint;
    head_hash text;
    new_xmin text;
    rec_seq bigint;
BEGIN
    -- FOR UPDATE, as the lane's lock: it also waits for an exec record's key-share guard.
    SELECT s.doc, s.env_sealed, s.xmin::text INTO cur_doc, cur_env, cur_xmin
    FROM sandboxes s WHERE s.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'gone'::text, NULL::bigint, NULL::text, NULL::jsonb, NULL::bytea,
                            NULL::bigint, NULL::text;
        RETURN;
    END IF;
    SELECT h.chain_seq, h.hash INTO head_seq, head_hash
    FROM audit_heads h WHERE h.chain = a_chain FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_head'::text, NULL::bigint, cur_xmin, cur_doc, cur_env,
                            NULL::bigint, NULL::text;
        RETURN;
    END IF;
    IF cur_xmin <> p_xmin OR head_seq <> p_prev_seq THEN
        RETURN QUERY SELECT CASE WHEN cur_xmin <> p_xmin THEN 'row_moved' ELSE 'head_moved' END,
                            NULL::bigint, cur_xmin, cur_doc, cur_env, head_seq, head_hash;
        RETURN;
    END IF;
    UPDATE sandboxes SET status = p_status, status_version = p_status_version, pool = p_pool,
        backend_ref = p_backend_ref, attempts = p_attempts, priority = p_priority, cpu = p_cpu,
        memory_mib = p_memory_mib, disk_gib = p_disk_gib, expires_at = p_expires_at,
        updated_at = p_updated_at, doc = p_doc, env_sealed = p_env_sealed
    WHERE id = p_id
    RETURNING xmin::text INTO new_xmin;
    UPDATE audit_heads SET chain_seq = a_chain_seq, hash = a_hash WHERE chain = a_chain;
    INSERT INTO audit_events (chain, chain_seq, org_id, project_id, actor, action, resource,
        outcome, request_id, at, detail, prev_hash, hash, key_id)
    VALUES (a_chain, a_chain_seq, a_org_id, a_project_id, a_actor, a_action, a_resource,
        a_outcome, a_request_id, a_at, a_detail, a_prev_hash, a_hash, a_key_id)
    RETURNING seq INTO rec_seq;
    RETURN QUERY SELECT 'done'::text, rec_seq, new_xmin, NULL::jsonb, NULL::bytea,
                        NULL::bigint, NULL::text;
END
$$;
