-- The newest record of every audit chain, one row per chain, kept in the append's own
-- transaction. An append locks its chain's row with `SELECT … FOR UPDATE`, which also returns
-- the newest committed head, so it costs two statements (lock-and-read, insert-and-advance)
-- instead of three (advisory lock, head read, insert): every state change appends one.
--
-- `audit_events` stays the record and the only thing `verify` trusts. A wrong head row cannot
-- hide anything: a stale `chain_seq` makes the next append collide on the unique
-- (chain, chain_seq) index and fail (the action with it), a wrong `hash` becomes a broken
-- link that `verify` reports.

CREATE TABLE IF NOT EXISTS audit_heads (
    chain     text PRIMARY KEY,
    chain_seq bigint NOT NULL,
    hash      text NOT NULL
);

INSERT INTO audit_heads (chain, chain_seq, hash)
SELECT DISTINCT ON (chain) chain, chain_seq, hash FROM audit_events
WHERE chain IS NOT NULL ORDER BY chain, chain_seq DESC
ON CONFLICT (chain) DO NOTHING;
