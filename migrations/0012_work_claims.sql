-- Work claims (issue #27): which worker is calling the backend for one status version of a
-- sandbox row: the create of a provisioning row's activation, or the delete of a terminating
-- row (every status change bumps the version, so each is claimed on its own). A worker takes
-- the claim before the call whether the work reached it over the bus or by its scan of the
-- store (the fallback that keeps creates and deletes moving while a JetStream stream or
-- consumer elects a leader), so the two paths never make one call twice at once.
--
-- UNLOGGED: a claim matters only while its holder works (it runs out after the worker's ack
-- wait), so it is not worth a WAL flush on every create. A Postgres crash or a failover to a
-- standby empties the table; the worst that can follow is what a bus redelivery could always
-- do: a second create or delete of the same sandbox id, which the adapters resolve (create
-- is idempotent on the sandbox id, a delete of a missing instance is fine).
CREATE UNLOGGED TABLE work_claims (
    sandbox_id text COLLATE "C" NOT NULL,
    status_version bigint NOT NULL,
    -- The holding worker; '' once it let go (free again from held_until).
    owner text NOT NULL,
    held_until timestamptz NOT NULL,
    -- How many times this call was claimed: the worker's attempt count, whichever path
    -- each attempt came by.
    tries integer NOT NULL,
    PRIMARY KEY (sandbox_id, status_version)
);
CREATE INDEX work_claims_held_until_idx ON work_claims (held_until);
