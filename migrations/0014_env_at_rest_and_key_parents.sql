-- Sandbox env values at rest, and which key minted which.
--
-- With a secrets key configured (DIFFERENTLY_SECRETS_KEY), a sandbox's env map is sealed
-- (AES-256-GCM, the sandbox id in the associated data) into env_sealed and the document keeps
-- the variable names with empty values. Without a key the document holds the values as before
-- and env_sealed stays NULL. Rows written before this migration are sealed by the store at
-- start-up when a key is present (SQL has no key).
ALTER TABLE sandboxes ADD COLUMN env_sealed bytea;

-- A sandbox that ended needs its env no more: clear the values of rows that already ended
-- (the names stay, as the API shows them). Rows ending from now on are cleared by the store
-- in the transaction that ends them.
UPDATE sandboxes
SET doc = jsonb_set(doc, '{spec,env}',
        COALESCE((SELECT jsonb_object_agg(k, '') FROM jsonb_object_keys(doc -> 'spec' -> 'env') AS k),
                 '{}'::jsonb))
WHERE status IN ('terminated', 'failed')
  AND jsonb_typeof(doc -> 'spec' -> 'env') = 'object'
  AND EXISTS (SELECT 1 FROM jsonb_each_text(doc -> 'spec' -> 'env') AS e WHERE e.value <> '');

-- The key that minted a key (NULL when no key did): revoking a key revokes every key below it.
-- Keys made before this column get their parent from the audit record of their creation.
ALTER TABLE api_keys ADD COLUMN parent_key_id text;
UPDATE api_keys k
SET parent_key_id = substr(a.actor, 5)
FROM audit_events a
WHERE a.action = 'key.create' AND a.resource = k.id AND a.actor LIKE 'key:%';
CREATE INDEX api_keys_parent_idx ON api_keys (parent_key_id) WHERE parent_key_id IS NOT NULL;
