// One sandbox: status (live), actions, resources, TTL and idle state, placement explanation,
// status history and recent execs from the audit log, files, snapshots and a terminal.

import { api, get, qs, raw, sse } from './api.js';
import { h, replace, badge, time, table, kv, errorBox, announce } from './dom.js';
import { eventSandboxId, STATUSES } from './tenant.js';
import { openTerminal } from './terminal.js';
import { LiveSandboxes } from './live.js';

const FINAL = ['terminated', 'failed'];
const EXEC_ACTIONS = ['sandbox.exec', 'sandbox.exec_stream', 'sandbox.pty'];

/** Audit actions that put a sandbox in a status without naming it in their detail. */
const ENTERS = { 'sandbox.admit': 'queued', 'sandbox.requeue': 'queued', 'sandbox.activate': 'provisioning' };

/**
 * The status change an audit record is, or null. A change records its new status as
 * `detail.to` (with `from` and `reason`) or as its action (`sandbox.running`); admission and
 * activation enter `queued` and `provisioning`. Requests (`sandbox.pause` with outcome
 * `requested`), execs and file calls are not status changes.
 */
export function statusChange(r) {
  if (r.outcome !== 'ok' || !r.action.startsWith('sandbox.')) return null;
  const d = r.detail || {};
  if (typeof d.to === 'string' && STATUSES.includes(d.to)) {
    return { to: d.to, from: typeof d.from === 'string' ? d.from : null, reason: typeof d.reason === 'string' ? d.reason : null };
  }
  const named = r.action.slice('sandbox.'.length);
  const to = STATUSES.includes(named) ? named : ENTERS[r.action];
  return to ? { to, from: null, reason: typeof d.reason === 'string' ? d.reason : null } : null;
}

function seconds(n) {
  if (n === null || n === undefined) return 'not set';
  if (n % 3600 === 0) return `${n / 3600} h`;
  if (n % 60 === 0) return `${n / 60} min`;
  return `${n} s`;
}

function summary(sbx) {
  const r = sbx.resources || {};
  const idle = sbx.status === 'paused' || sbx.status === 'stopped'
    ? (sbx.statusReason === 'idle timeout' ? `${sbx.status} by the idle sweep` : `${sbx.status}`)
    : sbx.status === 'running' ? 'active' : '—';
  return h('dl', { class: 'kv', id: 'sandbox-summary' },
    h('dt', {}, 'Status'), h('dd', { id: 'sandbox-status' }, badge(sbx.status), ' ', sbx.statusReason || ''),
    h('dt', {}, 'Pool'), h('dd', { id: 'sandbox-pool' }, sbx.pool || '— (not placed yet)'),
    h('dt', {}, 'Project'), h('dd', { class: 'mono' }, sbx.projectId),
    h('dt', {}, 'Resources'), h('dd', {}, `${r.cpu ?? '?'} CPU · ${r.memoryMiB ?? '?'} MiB memory · ${r.diskGiB ?? '?'} GiB disk`),
    h('dt', {}, 'Template'), h('dd', {}, sbx.template || 'default'),
    h('dt', {}, 'Capabilities asked'), h('dd', {}, (sbx.capabilities || []).join(', ') || 'none'),
    h('dt', {}, 'Classification · region'), h('dd', {}, `${sbx.classification || '—'} · ${sbx.region || 'any'}`),
    h('dt', {}, 'Labels'), h('dd', {}, Object.entries(sbx.labels || {}).map(([k, v]) => `${k}=${v}`).join(', ') || 'none'),
    h('dt', {}, 'TTL'), h('dd', {}, seconds(sbx.ttlSeconds), sbx.expiresAt ? [' · expires ', time(sbx.expiresAt)] : ''),
    h('dt', {}, 'Idle timeout'), h('dd', {}, seconds(sbx.idleTimeoutSeconds), ' · idle state: ', idle),
    h('dt', {}, 'Env keys'), h('dd', {}, (sbx.env && Object.keys(sbx.env).length ? Object.keys(sbx.env) : sbx.envKeys || []).join(', ') || 'none'),
    h('dt', {}, 'Attempts · priority'), h('dd', {}, `${sbx.attempts ?? 0} · ${sbx.priority ?? 0}`),
    h('dt', {}, 'Created'), h('dd', {}, time(sbx.createdAt)),
    h('dt', {}, 'Started'), h('dd', {}, time(sbx.startedAt)),
    h('dt', {}, 'Ended'), h('dd', {}, time(sbx.endedAt)));
}

function placementView(doc) {
  const pools = Array.isArray(doc.pools) ? doc.pools : [];
  return h('div', { id: 'placement' },
    h('p', {}, 'Decision: ', h('strong', { id: 'placement-decision' }, doc.decision || '—'),
      doc.pool ? [' on pool ', h('strong', {}, doc.pool)] : '',
      doc.wall ? [' · waiting behind the ', h('strong', {}, doc.wall), ' wall'] : '',
      doc.reason ? [' · ', doc.reason] : ''),
    pools.length ? table('Pools considered', [
      ['Pool', (p) => p.name],
      ['Eligible', (p) => (p.eligible ? h('span', { class: 'ok' }, 'yes') : h('span', { class: 'bad' }, 'no'))],
      ['Why / score', (p) => [p.reason || '', p.score !== undefined && p.score !== null ? ` score ${p.score}` : '']],
    ], pools) : null,
    h('details', {}, h('summary', {}, 'The whole explanation'), kv(doc)));
}

export async function page(ctx, [id]) {
  const { el, who, signal } = ctx;
  const live = new LiveSandboxes();
  const firstMark = live.mark();
  let sbx = await get(`/v1/sandboxes/${encodeURIComponent(id)}`);
  live.record(sbx, firstMark);
  const msg = h('div', { 'aria-live': 'polite' });
  const summaryBox = h('div');
  const actions = h('div', { class: 'row' });
  const placementBox = h('div');
  const historyBox = h('div');
  const activityBox = h('div');
  const execBox = h('div');
  const filesBox = h('div');
  const snapsBox = h('div');
  const termBox = h('div');
  let closeTerm = null;

  async function act(label, method, path, body) {
    try {
      const mark = live.mark();
      const r = await api(method, path, body);
      announce(`${label}: done`);
      if (r && r.id && r.id.startsWith('sbx_') && live.record(r, mark)) { sbx = live.view(r.id); render(); }
      await Promise.all([refresh(), loadSnapshots()]);
    } catch (e) { replace(msg, errorBox(e)); }
  }
  function render() {
    replace(summaryBox, summary(sbx));
    const w = who.has('sandboxes:write');
    const live = !FINAL.includes(sbx.status) && sbx.status !== 'terminating';
    const base = `/v1/sandboxes/${sbx.id}`;
    replace(actions,
      sbx.status === 'running' ? h('button', { type: 'button', disabled: !w, onclick: () => act('Pause', 'POST', `${base}/pause`) }, 'Pause') : null,
      sbx.status === 'paused' ? h('button', { type: 'button', disabled: !w, onclick: () => act('Resume', 'POST', `${base}/resume`) }, 'Resume') : null,
      sbx.status === 'running' ? h('button', { type: 'button', disabled: !w, onclick: () => act('Stop', 'POST', `${base}/stop`) }, 'Stop') : null,
      sbx.status === 'stopped' ? h('button', { type: 'button', disabled: !w, onclick: () => act('Start', 'POST', `${base}/start`) }, 'Start') : null,
      sbx.status === 'running' ? h('button', { type: 'button', class: 'secondary', disabled: !w, onclick: () => act('Snapshot', 'POST', `${base}/snapshots`, {}) }, 'Take snapshot') : null,
      sbx.status === 'running' ? h('button', { type: 'button', class: 'secondary', disabled: !w, onclick: () => act('Keepalive', 'POST', `${base}/keepalive`) }, 'Keep alive') : null,
      live ? h('button', { type: 'button', class: 'danger', disabled: !w, onclick: () => act('Delete', 'DELETE', base) }, 'Delete sandbox') : null);
    if (sbx.status === 'running') {
      if (!termBox.childElementCount) {
        replace(termBox, h('button', { type: 'button', id: 'open-terminal', disabled: !who.has('sandboxes:exec'), onclick: () => {
          closeTerm = openTerminal(termBox, sbx.id, announce);
        } }, 'Open terminal'));
      }
    } else if (!closeTerm) {
      replace(termBox, h('p', { class: 'muted' }, 'A terminal opens on a running sandbox whose pool offers exec.pty.'));
    }
  }
  async function refresh() {
    const mark = live.mark();
    live.record(await get(`/v1/sandboxes/${sbx.id}`), mark);
    sbx = live.view(sbx.id);
    render();
    await Promise.all([loadPlacement(), loadAudit()]);
  }
  // Coalesced: an event during a refresh asks for one more after it, never for nothing.
  let refreshing = null;
  let again = false;
  function refreshSoon() {
    if (refreshing) { again = true; return refreshing; }
    refreshing = (async () => {
      try {
        do { again = false; await refresh(); } while (again);
      } finally { refreshing = null; }
    })();
    return refreshing;
  }
  async function loadPlacement() {
    try { replace(placementBox, placementView(await get(`/v1/sandboxes/${sbx.id}/placement`))); } catch (e) {
      replace(placementBox, e.status === 404 ? h('p', { class: 'muted' }, 'No placement decision recorded yet.') : errorBox(e));
    }
  }
  async function loadAudit() {
    try {
      const page = await get(`/v1/audit${qs({ resource: sbx.id, limit: 200, orgId: who.admin ? sbx.orgId : undefined })}`);
      const items = page.items.slice().sort((a, b) => b.seq - a.seq);
      const execs = items.filter((r) => EXEC_ACTIONS.includes(r.action));
      const changes = items.map((r) => ({ r, c: statusChange(r) })).filter((x) => x.c);
      const other = items.filter((r) => !EXEC_ACTIONS.includes(r.action) && !statusChange(r));
      replace(historyBox, table('Status history', [
        ['When', ({ r }) => time(r.at)],
        ['Status', ({ c }) => badge(c.to)],
        ['From', ({ c }) => (c.from ? badge(c.from) : '')],
        ['Reason', ({ c }) => c.reason || ''],
        ['By', ({ r }) => r.actor],
      ], changes, 'No status change recorded yet.'));
      replace(activityBox, table('Other audit records', [
        ['When', (r) => time(r.at)],
        ['Action', (r) => r.action],
        ['Detail', (r) => (r.detail && Object.keys(r.detail).length ? h('code', {}, JSON.stringify(r.detail)) : '')],
        ['Actor', (r) => r.actor],
        ['Outcome', (r) => r.outcome],
      ], other, 'No other audit records.'));
      replace(execBox, table('Recent execs', [
        ['When', (r) => time(r.at)],
        ['Kind', (r) => r.action.replace('sandbox.', '')],
        ['Program', (r) => h('code', {}, (r.detail && r.detail.program) || '')],
        ['Actor', (r) => r.actor],
        ['Outcome', (r) => r.outcome],
      ], execs.slice(0, 50), 'No execs yet.'));
    } catch (e) { replace(historyBox, errorBox(e)); replace(execBox); replace(activityBox); }
  }
  async function loadSnapshots() {
    try {
      const page = await get(`/v1/sandboxes/${sbx.id}/snapshots${qs({ limit: 100 })}`);
      replace(snapsBox, table('Snapshots', [
        ['Id', (s) => h('span', { class: 'mono' }, s.id)], ['Name', (s) => s.name || ''],
        ['Status', (s) => badge(s.status)], ['Created', (s) => time(s.createdAt)],
      ], page.items, 'No snapshots of this sandbox.'));
    } catch (e) { replace(snapsBox, errorBox(e)); }
  }
  const pathIn = h('input', { id: 'files-path', name: 'path', value: '/', size: 40 });
  async function loadFiles(path) {
    pathIn.value = path;
    try {
      const list = await get(`/v1/sandboxes/${sbx.id}/files/list${qs({ path, depth: 1 })}`);
      const items = list.items.slice().sort((a, b) => (a.type === b.type ? a.path.localeCompare(b.path) : a.type === 'directory' ? -1 : 1));
      const parent = path === '/' ? null : path.replace(/\/[^/]+\/?$/, '') || '/';
      replace(filesBox,
        parent ? h('p', {}, h('button', { type: 'button', class: 'secondary', onclick: () => loadFiles(parent) }, '↑ Parent directory')) : null,
        table(`Files in ${path}`, [
          ['Name', (f) => (f.type === 'directory'
            ? h('button', { type: 'button', class: 'secondary', onclick: () => loadFiles(f.path) }, `${f.path.split('/').pop() || f.path}/`)
            : h('span', { class: 'mono' }, f.path.split('/').pop()))],
          ['Type', (f) => f.type], ['Size', (f) => String(f.size ?? ''), 'num'], ['Mode', (f) => (typeof f.mode === 'number' ? h('span', { class: 'mono' }, f.mode.toString(8).padStart(4, '0')) : '')],
          ['Modified', (f) => time(f.modifiedAt)],
          ['', (f) => (f.type === 'file' ? h('button', { type: 'button', class: 'secondary', 'aria-label': `Download ${f.path}`, onclick: () => download(f.path) }, 'Download') : '')],
        ], items, 'Empty directory.'));
    } catch (e) { replace(filesBox, errorBox(e)); }
  }
  async function download(path) {
    try {
      const resp = await raw(`/v1/sandboxes/${sbx.id}/files${qs({ path })}`);
      const url = URL.createObjectURL(await resp.blob());
      const a = h('a', { href: url, download: path.split('/').pop() || 'file' });
      document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) { replace(msg, errorBox(e)); }
  }
  const filesForm = h('form', { class: 'row', 'aria-label': 'Browse files', onsubmit: (ev) => { ev.preventDefault(); loadFiles(pathIn.value || '/'); } },
    h('label', { for: 'files-path' }, 'Path', pathIn), h('button', { type: 'submit' }, 'List'));

  const section = (title, idAttr, ...body) => h('section', { class: 'panel', 'aria-labelledby': idAttr }, h('h2', { id: idAttr }, title), ...body);
  replace(el,
    h('p', {}, h('a', { href: '#/sandboxes' }, '← All sandboxes')),
    h('h1', {}, 'Sandbox ', h('span', { class: 'mono' }, sbx.id)),
    msg, actions, summaryBox,
    section('Placement', 'placement-h', placementBox),
    section('Terminal', 'terminal-h', termBox),
    section('Recent execs', 'execs-h', execBox),
    section('Status history', 'history-h', historyBox),
    section('Other audit records', 'activity-h',
      h('p', { class: 'muted' }, 'Requests and calls on this sandbox that the audit log holds (operations asked for, file transfers, …); execs are above.'),
      activityBox),
    section('Files', 'files-h', filesForm, filesBox),
    section('Snapshots', 'snaps-h', snapsBox));
  render();
  await Promise.all([loadPlacement(), loadAudit(), loadSnapshots()]);
  if (sbx.status === 'running' && who.has('files:read')) loadFiles('/');
  else replace(filesBox, h('p', { class: 'muted' }, 'Files can be listed while the sandbox runs.'));

  signal.addEventListener('abort', () => { if (closeTerm) closeTerm(); });
  let shown = sbx.status;
  function changed() {
    if (shown === sbx.status) return;
    shown = sbx.status;
    announce(`Sandbox is ${sbx.status}`);
    if (sbx.status === 'running' && who.has('files:read')) loadFiles('/');
  }
  sse(`/v1/events${qs({ sandboxId: sbx.id })}`, async ({ data }) => {
    if (eventSandboxId(data) !== sbx.id) return;
    // The event's status shows at once (when it is newer than what is shown); the re-read
    // brings the rest (times, placement, history).
    if (live.event(data)) { sbx = live.view(sbx.id); render(); changed(); }
    try { await refreshSoon(); } catch { return; }
    changed();
  }, signal, async (state) => {
    // (Re)connected: what changed while the stream was not open is read again.
    if (state !== 'live') return;
    try { await refreshSoon(); } catch { return; }
    changed();
  }).catch(() => {});
}
