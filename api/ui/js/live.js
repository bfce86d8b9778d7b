// The newest known state of each sandbox a live page shows, from two sources that arrive in
// any order: records the API answered (every field, but no statusVersion) and status events
// (status fields with their statusVersion). No DOM here, so node tests it directly.
//
// Why both rules below are needed: a record answered to a request that began before a change
// arrives after that change's event (a create's answer says `provisioning` while the event
// stream already said `running`), and one sandbox's events can arrive out of order
// (docs/events.md, "Order").

export class LiveSandboxes {
  constructor() {
    this.tick = 0;
    this.records = new Map();
    this.events = new Map();
  }

  /** A mark to take just before asking the API for a record (or a page of them). */
  mark() {
    this.tick += 1;
    return this.tick;
  }

  /**
   * A record the API answered to a request begun at `mark`. Kept unless the record held came
   * from a request begun later (an answer that overtook this one). Returns whether it was kept.
   */
  record(sbx, mark) {
    const held = this.records.get(sbx.id);
    if (held && held.mark > mark) return false;
    this.records.set(sbx.id, { sbx, mark });
    return true;
  }

  /**
   * A status event (`sandboxId`, `status`, `statusReason`, `pool`, `statusVersion`). Dropped
   * when its statusVersion is not above the last one applied for that sandbox (a late or
   * repeated change). Returns whether it was applied.
   */
  event(ev) {
    if (!ev || typeof ev.sandboxId !== 'string' || typeof ev.status !== 'string') return false;
    const version = Number(ev.statusVersion);
    if (!Number.isFinite(version)) return false;
    const held = this.events.get(ev.sandboxId);
    if (held && version <= held.statusVersion) return false;
    this.events.set(ev.sandboxId, {
      status: ev.status, statusReason: ev.statusReason ?? null, pool: ev.pool ?? null,
      statusVersion: version, mark: this.mark(),
    });
    return true;
  }

  /** Whether a record of `id` is held (an event alone cannot make a row). */
  has(id) { return this.records.has(id); }

  ids() { return [...this.records.keys()]; }

  /**
   * What to show for `id`: the record, with the status of the newest event when that event
   * arrived after the record's request began. Such an event is newer than the record, or, if
   * it is an older change delivered late, a newer event is still on its way and replaces it;
   * an event that arrived before the request began is never newer than what the API answered.
   */
  view(id) {
    const held = this.records.get(id);
    if (!held) return null;
    const ev = this.events.get(id);
    if (!ev || ev.mark < held.mark) return held.sbx;
    return { ...held.sbx, status: ev.status, statusReason: ev.statusReason, pool: ev.pool ?? held.sbx.pool };
  }
}

const ENDED = ['terminated', 'failed'];

/** Whether a sandbox has ended (it will not change again). */
export function ended(sbx) { return ENDED.includes(sbx.status); }

/**
 * The list's order: live sandboxes before ended ones, newest first inside each group. Ids
 * are ULIDs, so a later id is a later creation (the same order as `createdAt`, without
 * parsing times).
 */
export function listOrder(a, b) {
  const byEnd = Number(ended(a)) - Number(ended(b));
  if (byEnd) return byEnd;
  return a.id < b.id ? 1 : a.id > b.id ? -1 : 0;
}
