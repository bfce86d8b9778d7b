-- Create claims (issue #27): which worker is calling the backend's create for one activation
-- of a provisioning row (the row's id and its status version, which every activation bumps).
-- A worker takes the claim before the call whether the work reached it over the bus or by
-- its scan of the store (the fallback that keeps creates moving while a JetStream stream or
-- consumer elects a leader), so the two paths never run two creates of one activation at once.
--
-- UNLOGGED: a claim matters only while its holder works (it runs out after the worker's ack
-- wait), so it is not worth a WAL flush on every create. A Postgres crash or a failover to a
-- standby empties the table; the worst that can follow is what a bus redelivery could always
-- do: a second create of the same sandbox id, which the adapters' idempotent create resolves
-- (it finds the instance tagged with that id).
CREATE UNLOGGED TABLE create_claims (
    sandbox_id text COLLATE "C" NOT NULL,
    status_version bigint NOT NULL,
    -- The holding worker; '' once it let go (free again from held_until).
    owner text NOT NULL,
    held_until timestamptz NOT NULL,
    -- How many times this activation's create was claimed: the worker's attempt count,
    -- whichever path each attempt came by.
    tries integer NOT NULL,
    PRIMARY KEY (sandbox_id, status_version)
);
CREATE INDEX create_claims_held_until_idx ON create_claims (held_until);
