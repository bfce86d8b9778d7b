-- Fair delivery claims: each enabled webhook offers its oldest due deliveries, at most its
-- in-flight cap less what it has in flight, and the claim takes them in turns per
-- organization and per webhook instead of in one global due order (one tenant's backlog
-- held every other tenant's deliveries behind it). Both probes are per webhook.
CREATE INDEX webhook_deliveries_webhook_due_idx
    ON webhook_deliveries (webhook_id, next_attempt_at, id) WHERE status = 'pending';
-- Deliveries under a lease: few (in flight, or left by a claimer that died), counted per
-- webhook against its cap.
CREATE INDEX webhook_deliveries_in_flight_idx
    ON webhook_deliveries (webhook_id, lease_until)
    WHERE status = 'pending' AND lease_until IS NOT NULL;
-- The global due order is no longer read.
DROP INDEX webhook_deliveries_due_idx;
