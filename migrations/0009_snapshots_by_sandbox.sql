-- A sandbox's snapshots are listed a page at a time (GET /v1/sandboxes/{id}/snapshots
-- ?limit=&cursor=): by sandbox, in id order, from a cursor.
CREATE INDEX snapshots_sandbox_idx ON snapshots (sandbox_id, id);
