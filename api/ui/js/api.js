// The `/v1` client of the dashboard. The API key lives in sessionStorage (gone when the tab
// closes), travels only in the Authorization header (never a URL, never a cookie), and is
// never written to the console or the page.

const KEY = 'differently.apiKey';

export function getKey() { return sessionStorage.getItem(KEY); }
export function setKey(k) { sessionStorage.setItem(KEY, k); }
export function clearKey() { sessionStorage.removeItem(KEY); }

/** An API error: the envelope's code, message and details. */
export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || 'http_' + status;
    this.details = e.details || {};
  }
}

function headers(extra) {
  const h = new Headers(extra || {});
  const k = getKey();
  if (k) h.set('Authorization', `Bearer ${k}`);
  return h;
}

/** Calls the API; JSON in, JSON (or null for 204) out; throws ApiError. */
export async function api(method, path, body, extra) {
  const init = { method, headers: headers(extra), credentials: 'omit', cache: 'no-store', referrerPolicy: 'no-referrer' };
  if (body !== undefined) {
    init.headers.set('Content-Type', 'application/json');
    init.body = JSON.stringify(body);
  }
  if (method === 'POST' && !init.headers.has('Idempotency-Key')) {
    init.headers.set('Idempotency-Key', crypto.randomUUID());
  }
  const resp = await fetch(path, init);
  if (resp.status === 204) return null;
  const type = resp.headers.get('content-type') || '';
  const data = type.startsWith('application/json') ? await resp.json() : await resp.text();
  if (!resp.ok) throw new ApiError(resp.status, typeof data === 'object' ? data : null);
  return data;
}

export const get = (p) => api('GET', p);

/** Every item of a paged list, following `nextCursor` (1,000 a page, the most a page holds). */
export async function getAll(path) {
  const items = [];
  let cursor;
  do {
    const sep = path.includes('?') ? '&' : '?';
    const page = await get(`${path}${sep}limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
    items.push(...(page.items || []));
    cursor = page.nextCursor;
  } while (cursor);
  return items;
}

/** The raw response of an authenticated GET (downloads). */
export async function raw(path) {
  const resp = await fetch(path, { headers: headers(), credentials: 'omit', cache: 'no-store' });
  if (!resp.ok) {
    let body = null;
    try { body = await resp.json(); } catch { /* not JSON */ }
    throw new ApiError(resp.status, body);
  }
  return resp;
}

/** A query string from an object, skipping empty values; arrays repeat the name. */
export function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === '') continue;
    for (const one of Array.isArray(v) ? v : [v]) if (one !== '') u.append(k, one);
  }
  const s = u.toString();
  return s ? `?${s}` : '';
}

/** The key's id (`key_…`) from its text, or null. */
export function keyIdOf(k) {
  const m = /^dly_(key_[0-9A-Za-z]+)_[A-Za-z0-9]+$/.exec(k || '');
  return m ? m[1] : null;
}

/**
 * Who the key is, from its own record (every key may read its own; the bootstrap key too,
 * though it is configuration and not a stored key). The organization and project are the
 * record's: the API creates and lists sandboxes in the key's own organization only, so the
 * page never picks another one, even for an operator key that may administer them all. The
 * views shown follow the scopes; the API enforces them either way (a hidden view is a
 * convenience, never the protection).
 */
export async function whoami() {
  const id = keyIdOf(getKey());
  if (!id) throw new ApiError(401, { error: { code: 'unauthenticated', message: 'this is not an API key (dly_key_…)' } });
  let record;
  try {
    record = await get(`/v1/keys/${id}`);
  } catch (e) {
    if (e.status !== 404) throw e;
    record = await unrecordedKey(id);
  }
  const scopes = record.scopes || [];
  const admin = scopes.includes('admin');
  const has = (s) => scopes.includes(s) || admin;
  return { id, name: record.name, orgId: record.orgId, projectId: record.projectId || null, scopes, admin, has };
}

/**
 * A key the server authenticates but keeps no record of (the bootstrap key, on a server that
 * does not answer for it): an operator key if it may read the pools, acting in the
 * organization whose projects it lists by default (its own).
 */
async function unrecordedKey(id) {
  let admin = false;
  try {
    await get('/v1/admin/pools?limit=1');
    admin = true;
  } catch (e) {
    if (e.status === 401) throw e;
  }
  const projects = (await get('/v1/projects?limit=1000')).items;
  return { id, name: admin ? 'bootstrap key' : id, orgId: projects.length ? projects[0].orgId : null,
    projectId: null, scopes: admin ? ['admin'] : [] };
}

/**
 * Server-sent events over fetch(), because EventSource cannot send an Authorization header.
 * Calls `onEvent({event, id, data})` per event; reconnects with Last-Event-ID after a drop;
 * `signal` (an AbortSignal) ends it.
 */
export async function sse(path, onEvent, signal, onState) {
  let last = null;
  let wait = 500;
  while (!signal.aborted) {
    try {
      const h = headers({ Accept: 'text/event-stream' });
      if (last) h.set('Last-Event-ID', last);
      const resp = await fetch(path, { headers: h, signal, credentials: 'omit', cache: 'no-store' });
      if (!resp.ok) {
        let body = null;
        try { body = await resp.json(); } catch { /* not JSON */ }
        throw new ApiError(resp.status, body);
      }
      if (onState) onState('live');
      wait = 500;
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      let ev = { event: 'message', data: [], id: null };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let nl;
        while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + (buf.startsWith('\r\n', nl) ? 2 : 1));
          if (line === '') {
            if (ev.data.length) {
              if (ev.id !== null) last = ev.id;
              let data = ev.data.join('\n');
              try { data = JSON.parse(data); } catch { /* keep the text */ }
              onEvent({ event: ev.event, id: ev.id, data });
            }
            ev = { event: 'message', data: [], id: null };
            continue;
          }
          if (line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let val = colon < 0 ? '' : line.slice(colon + 1);
          if (val.startsWith(' ')) val = val.slice(1);
          if (field === 'data') ev.data.push(val);
          else if (field === 'event') ev.event = val;
          else if (field === 'id') ev.id = val;
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
        if (onState) onState('refused');
        return;
      }
    }
    if (onState) onState('reconnecting');
    await new Promise((r) => setTimeout(r, wait));
    wait = Math.min(wait * 2, 10000);
  }
}
