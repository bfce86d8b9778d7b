/**
 * A Server-Sent Events parser over a byte stream (the WHATWG rules: LF, CR or CRLF line ends,
 * `:` comments, `data:` lines joined by LF, `id:` and `retry:`), as an async iterator.
 * Written for throughput: it decodes once per network chunk and scans for blank lines.
 */

export interface SseMessage {
  /** `event:` (default `message`). */
  event: string;
  /** `data:` lines joined by `\n`. */
  data: string;
  /** The last `id:` seen on the stream so far (carried over like a browser's lastEventId). */
  id: string | undefined;
  /** `retry:` in ms, when this message set it. */
  retry: number | undefined;
}

/** Parses one event block (lines without the blank line); undefined when nothing to dispatch. */
function parseBlock(block: string, state: { id: string | undefined }): SseMessage | undefined {
  let event = "";
  let data: string | undefined;
  let retry: number | undefined;
  let start = 0;
  while (start <= block.length) {
    let end = block.indexOf("\n", start);
    if (end === -1) end = block.length;
    const line = block.slice(start, end);
    start = end + 1;
    if (line.length === 0 || line.charCodeAt(0) === 58 /* : */) continue;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.charCodeAt(0) === 32) value = value.slice(1);
    switch (field) {
      case "event":
        event = value;
        break;
      case "data":
        data = data === undefined ? value : `${data}\n${value}`;
        break;
      case "id":
        if (!value.includes("\0")) state.id = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) retry = Number(value);
        break;
      default:
        break;
    }
  }
  if (data === undefined) return undefined;
  return { event: event || "message", data, id: state.id, retry };
}

/**
 * Yields each message of an SSE body. `state.id` tracks the last event id across messages
 * (and lets a caller read it after the stream breaks, to resume).
 */
export async function* parseSse(
  body: ReadableStream<Uint8Array>,
  state: { id: string | undefined } = { id: undefined },
): AsyncGenerator<SseMessage> {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  let buf = "";
  let carryCr = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      let chunk = done ? decoder.decode() : decoder.decode(value, { stream: true });
      if (carryCr) {
        chunk = `\r${chunk}`;
        carryCr = false;
      }
      if (chunk.includes("\r")) {
        // A trailing CR may be the first half of a CRLF split across reads: hold it back.
        if (!done && chunk.endsWith("\r")) {
          carryCr = true;
          chunk = chunk.slice(0, -1);
        }
        chunk = chunk.replace(/\r\n?/g, "\n");
      }
      buf += chunk;
      let from = 0;
      for (;;) {
        const blank = buf.indexOf("\n\n", from);
        if (blank === -1) break;
        const msg = parseBlock(buf.slice(from, blank), state);
        from = blank + 2;
        if (msg) yield msg;
      }
      if (from > 0) buf = buf.slice(from);
      if (done) return; // an unterminated last block is not dispatched (per the spec)
    }
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}
