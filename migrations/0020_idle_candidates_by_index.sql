-- The idle sweep without a scan of every running row (issue #47, "Scale").
--
-- `idle_candidates` compared each running row's own idle timeout (or the installation's
-- default) with its last activity: a sequential pass over every running row and its
-- document on every sweep, 28-34 ms at 10k live and growing with the fleet. It now asks in
-- two parts. Rows with their own timeout (`spec.idleTimeoutSeconds`, usually few) are read
-- through this partial index and compared as before. Rows under the default are idle only
-- if neither their last write nor their last activity is newer than now minus the default,
-- a range of `sandboxes_status_updated_idx` (status, updated_at) that is empty while every
-- running row was written recently.
--
-- The index is on the timeout expression itself, not on `updated_at`: only then does ANALYZE
-- keep statistics for the expression, and without them the planner guessed half the running
-- rows had a timeout of their own and scanned them all (measured: 6.5-7.7 ms against
-- 1.2-1.6 ms at 10k running rows, 100 with their own timeout; 14-16 ms before).
CREATE INDEX sandboxes_own_idle_timeout_idx ON sandboxes ((doc -> 'spec' ->> 'idleTimeoutSeconds'))
    WHERE status = 'running' AND (doc -> 'spec' ->> 'idleTimeoutSeconds') IS NOT NULL;
