"""Subscribe to one organization's public Differently events with nats-py.

The credential comes from `POST /v1/events/credentials` (its `token`, `inboxPrefix`,
`subscribe` and `stream` fields). Events are replayed from the start of the retained
stream through a pull consumer filtered on the organization, then followed live.
Run by bus/tests/bus/callout.rs against a real nats-server.
"""

import asyncio
import json
import os
import uuid

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy


async def main() -> None:
    nc = await nats.connect(
        os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
        token=os.environ["DIFFERENTLY_EVENTS_TOKEN"],
        # Replies (consumer creation, fetches) come back under the credential's own inbox.
        inbox_prefix=os.environ["DIFFERENTLY_EVENTS_INBOX"].encode(),
    )
    js = nc.jetstream()
    stream = os.environ.get("DIFFERENTLY_EVENTS_STREAM", "DLY_PUB")
    subject = os.environ["DIFFERENTLY_EVENTS_SUBJECT"]  # dly.pub.<org>.>
    name = f"example-{uuid.uuid4().hex[:12]}"
    # A named consumer with a filter inside the credential's subjects: the only kind the
    # credential may create. `opt_start_time` instead of DeliverPolicy.ALL replays from a time.
    await js.add_consumer(
        stream,
        ConsumerConfig(
            name=name,
            filter_subject=subject,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            inactive_threshold=60.0,
        ),
    )
    sub = await js.pull_subscribe_bind(name, stream=stream)
    wanted = int(os.environ.get("MAX_EVENTS", "0")) or None
    seen = 0
    while wanted is None or seen < wanted:
        try:
            msgs = await sub.fetch(10, timeout=5)
        except nats.errors.TimeoutError:
            continue
        for msg in msgs:
            event = json.loads(msg.data)
            status = event["data"].get("status", "")
            print(event["id"], event["type"], status, flush=True)
            await msg.ack()
            seen += 1
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
