-- Records and checkpoints name the key that signed them (so keys can rotate and old chains
-- still verify), and a checkpoint may start a new segment after a lost key (docs/audit.md).
-- Older rows keep NULL: they verify under any key the verifier holds.
ALTER TABLE audit_events ADD COLUMN key_id text;
ALTER TABLE audit_checkpoints ADD COLUMN key_id text, ADD COLUMN segment jsonb;
