-- A status change whose caller already knows the row's status and version, in one autocommit
-- statement with no read before it (issue #47).
--
-- The one-statement change of 0018 sends the whole new row, so it first reads the row, its
-- version (`xmin`) and its chain's head. A change that moves only the status (not to a final
-- status, which also clears env values, and not to `queued`, which clears the pool) changes
-- four fields of the document and three columns, whatever else the row holds: `status`,
-- `statusReason`, `statusVersion` and `updatedAt`. A caller that saw the row at a status and
-- version (the API deleting a sandbox it saw running) sends just those, merged into the
-- document here, guarded on that status and version instead of `xmin`: a TTL renewal or a
-- label change in between is kept, not overwritten, and moves no status version.
--
-- The record is hashed in Rust onto the chain head the caller last saw, as in 0018; the
-- head is guarded on its `chain_seq`. The row's org and project are checked against the
-- record's, so a record can never go to another tenant's chain.
--
-- o_outcome: `done` (o_seq the record's global seq; o_doc, o_env_sealed and o_xmin the row
-- as written); `row_moved` or `head_moved` (nothing written; the row and head now, for the
-- 0018 path to decide on without reading); `gone`; `no_head` (the row now; the chain's first
-- record takes the locking path).
CREATE FUNCTION differently_patch_sandbox_status(
    p_id text, p_from_status text, p_from_version bigint, p_prev_seq bigint,
    p_status text, p_updated_at timestamptz, p_patch jsonb,
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
    cur_status text;
    cur_version bigint;
    cur_org text;
    cur_project text;
    head_seq bigint;
    head_hash text;
    rec_seq bigint;
BEGIN
    -- The same locks in the same order as every writer: the row, then the head.
    SELECT s.doc, s.env_sealed, s.xmin::text, s.status, s.status_version, s.org_id,
           s.project_id
      INTO cur_doc, cur_env, cur_xmin, cur_status, cur_version, cur_org, cur_project
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
    IF cur_status <> p_from_status OR cur_version <> p_from_version
       OR cur_org <> a_org_id OR cur_project IS DISTINCT FROM a_project_id THEN
        RETURN QUERY SELECT 'row_moved'::text, NULL::bigint, cur_xmin, cur_doc, cur_env,
                            head_seq, head_hash;
        RETURN;
    END IF;
    IF head_seq <> p_prev_seq THEN
        RETURN QUERY SELECT 'head_moved'::text, NULL::bigint, cur_xmin, cur_doc, cur_env,
                            head_seq, head_hash;
        RETURN;
    END IF;
    UPDATE sandboxes SET status = p_status, status_version = p_from_version + 1,
        updated_at = p_updated_at, doc = doc || p_patch
    WHERE id = p_id
    RETURNING xmin::text, doc INTO cur_xmin, cur_doc;
    UPDATE audit_heads SET chain_seq = a_chain_seq, hash = a_hash WHERE chain = a_chain;
    INSERT INTO audit_events (chain, chain_seq, org_id, project_id, actor, action, resource,
        outcome, request_id, at, detail, prev_hash, hash, key_id)
    VALUES (a_chain, a_chain_seq, a_org_id, a_project_id, a_actor, a_action, a_resource,
        a_outcome, a_request_id, a_at, a_detail, a_prev_hash, a_hash, a_key_id)
    RETURNING seq INTO rec_seq;
    RETURN QUERY SELECT 'done'::text, rec_seq, cur_xmin, cur_doc, cur_env, NULL::bigint,
                        NULL::text;
END
$$;
