/**
 * Decoder of `application/vnd.differently.exec-stream`: frames of an 8-byte header (type, three
 * zero bytes, u32 big-endian length) and a payload. A frame may span reads, and one read may
 * hold many frames; payloads are yielded as views without copying where they fit one read.
 */

export const FRAME_HEARTBEAT = 0;
export const FRAME_STDOUT = 1;
export const FRAME_STDERR = 2;
export const FRAME_EXIT = 3;
export const FRAME_ERROR = 4;

export interface Frame {
  type: number;
  payload: Uint8Array;
}

/** Frames larger than this are refused as a corrupt stream (the server sends ≤ 64 KiB). */
const MAX_FRAME = 16 * 1024 * 1024;

export class FrameError extends Error {}

/** Yields each frame of the body; throws FrameError when a header is malformed. */
export async function* parseFrames(body: ReadableStream<Uint8Array>): AsyncGenerator<Frame> {
  const reader = body.getReader();
  let pending: Uint8Array = new Uint8Array(0);
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        if (pending.length > 0) throw new FrameError(`stream ended inside a frame (${pending.length} bytes left)`);
        return;
      }
      let buf: Uint8Array;
      if (pending.length === 0) buf = value;
      else {
        buf = new Uint8Array(pending.length + value.length);
        buf.set(pending, 0);
        buf.set(value, pending.length);
      }
      let off = 0;
      while (buf.length - off >= 8) {
        const type = buf[off]!;
        if (buf[off + 1] !== 0 || buf[off + 2] !== 0 || buf[off + 3] !== 0) {
          throw new FrameError(`malformed frame header at type ${type}`);
        }
        const len = ((buf[off + 4]! << 24) >>> 0) + (buf[off + 5]! << 16) + (buf[off + 6]! << 8) + buf[off + 7]!;
        if (len > MAX_FRAME) throw new FrameError(`frame of ${len} bytes is larger than any the server sends`);
        if (buf.length - off - 8 < len) break;
        yield { type, payload: buf.subarray(off + 8, off + 8 + len) };
        off += 8 + len;
      }
      pending = off === buf.length ? new Uint8Array(0) : buf.slice(off);
    }
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}
