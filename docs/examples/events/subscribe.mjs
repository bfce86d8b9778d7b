// Subscribe to one organization's public Differently events with nats.js 3.x
// (@nats-io/transport-node and @nats-io/jetstream), in plain ESM that Node >= 20 runs as is.
//
// The credential comes from `POST /v1/events/credentials` (its `token`, `inboxPrefix`,
// `subscribe` and `stream` fields). Events are replayed from the start of the retained
// stream through a pull consumer filtered on the organization, then followed live.
// Run by bus/tests/bus/callout.rs against a real nats-server, with the same inputs and
// output as subscribe.py beside it.
import { connect } from "@nats-io/transport-node";
import { jetstreamManager, AckPolicy, DeliverPolicy } from "@nats-io/jetstream";

const env = process.env;
const url = env.NATS_URL ?? "nats://127.0.0.1:4222";
const cred = {
  token: env.DIFFERENTLY_EVENTS_TOKEN,
  inboxPrefix: env.DIFFERENTLY_EVENTS_INBOX,
  stream: env.DIFFERENTLY_EVENTS_STREAM ?? "DLY_PUB",
  subscribe: env.DIFFERENTLY_EVENTS_SUBJECT, // dly.pub.<org>.>
};
const wanted = Number(env.MAX_EVENTS ?? "0") || Infinity;

// Replies (consumer creation, fetches) come back under the credential's own inbox.
const nc = await connect({ servers: url, token: cred.token, inboxPrefix: cred.inboxPrefix });
// checkAPI: false — the credential may not call $JS.API.INFO, which the default check does.
const jsm = await jetstreamManager(nc, { checkAPI: false });
// A named consumer with a filter inside the credential's subjects: the only kind the
// credential may create. `opt_start_time` with DeliverPolicy.StartTime replays from a time.
const name = `mine-${crypto.randomUUID().slice(0, 12)}`;
await jsm.consumers.add(cred.stream, {
  name, filter_subject: cred.subscribe, deliver_policy: DeliverPolicy.All,
  ack_policy: AckPolicy.Explicit, inactive_threshold: 60_000_000_000, // nanoseconds
});
const consumer = await jsm.jetstream().consumers.get(cred.stream, name);
let seen = 0;
for await (const m of await consumer.consume()) {
  const event = m.json();
  console.log(event.id, event.type, event.data.status ?? "");
  m.ack();
  if (++seen >= wanted) break;
}
// drain, not close: close does not flush what is still buffered, the last ack among it.
await nc.drain();
