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

/**
 * Yields each frame of the body; throws FrameError when a header is malformed or the body
 * ends inside a frame. Reads are queued and each frame is taken out once (a view when it sits
 * in one read, else one copy), so cost stays linear however the body is chunked.
 */
export async function* parseFrames(body: ReadableStream<Uint8Array>): AsyncGenerator<Frame> {
  const reader = body.getReader();
  let queue: Uint8Array[] = [];
  let qi = 0; // the first live entry (no shift(): that is O(n) per call)
  let queued = 0;
  let head = 0; // offset into queue[qi]
  const drop = () => {
    qi++;
    head = 0;
    if (qi === queue.length) {
      queue = [];
      qi = 0;
    }
  };

  /** Reads until `n` bytes are queued; false at the end of the body. */
  const fill = async (n: number): Promise<boolean> => {
    while (queued < n) {
      const { value, done } = await reader.read();
      if (done) return false;
      if (value.length > 0) {
        queue.push(value);
        queued += value.length;
      }
    }
    return true;
  };
  /** Takes `n` queued bytes. */
  const take = (n: number): Uint8Array => {
    const first = queue[qi]!;
    if (first.length - head >= n) {
      const out = first.subarray(head, head + n);
      head += n;
      if (head === first.length) drop();
      queued -= n;
      return out;
    }
    const out = new Uint8Array(n);
    let o = 0;
    while (o < n) {
      const c = queue[qi]!;
      const k = Math.min(n - o, c.length - head);
      out.set(c.subarray(head, head + k), o);
      o += k;
      head += k;
      if (head === c.length) drop();
    }
    queued -= n;
    return out;
  };

  try {
    for (;;) {
      if (!(await fill(8))) {
        if (queued > 0) throw new FrameError(`stream ended inside a frame header (${queued} bytes left)`);
        return;
      }
      const h = take(8);
      const type = h[0]!;
      if (h[1] !== 0 || h[2] !== 0 || h[3] !== 0) throw new FrameError(`malformed frame header (type ${type})`);
      const len = ((h[4]! << 24) >>> 0) + (h[5]! << 16) + (h[6]! << 8) + h[7]!;
      if (len > MAX_FRAME) throw new FrameError(`frame of ${len} bytes is larger than any the server sends`);
      if (!(await fill(len))) throw new FrameError(`stream ended inside a frame (${queued} of ${len} bytes)`);
      yield { type, payload: len === 0 ? new Uint8Array(0) : take(len) };
    }
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}
