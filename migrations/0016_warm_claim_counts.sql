-- Warm pools: creates that matched a warm class, per pool, class and minute: `hits` were
-- answered from a ready instance, `misses` went cold. Every API process adds what it
-- counted every few seconds, so the admin warm document (claims per minute, hit ratio) is
-- the same whichever replica answers it. Rows older than an hour are pruned by the writes.
CREATE TABLE warm_claim_counts (
    pool   text COLLATE "C" NOT NULL,
    class  text COLLATE "C" NOT NULL,
    minute timestamptz NOT NULL,
    hits   bigint NOT NULL DEFAULT 0,
    misses bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (pool, class, minute)
);
