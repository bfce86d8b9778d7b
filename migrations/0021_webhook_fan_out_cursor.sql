-- Where the webhook fan-out has read the public stream through (issue #47, "Messages").
--
-- The fan-out was a durable JetStream consumer shared by every worker process, acking each
-- public event one by one: 7 of the about 23 messages nats-server received per sandbox, paid
-- whether or not any webhook existed. It now runs on one process at a time (a session lock,
-- like the scheduler's), reads the stream with an ordered consumer that needs no acks, and
-- keeps its position here. The position is written only after the deliveries of every event
-- up to it are committed, so a fan-out that dies re-reads from the last one saved; that is
-- harmless, since a (webhook, event) pair is unique and a second insert does nothing.
CREATE TABLE webhook_fan_out (
    -- One row: the installation's fan-out.
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    -- Stream sequence of the public stream up to which every event was fanned out.
    through_seq bigint NOT NULL CHECK (through_seq >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
