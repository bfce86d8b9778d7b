// Tenant views: sandboxes (filters, create, live status), snapshots, keys, quota and usage.

import { api, get, qs, sse } from './api.js';
import { h, replace, badge, time, table, kv, errorBox, announce } from './dom.js';
import { LiveSandboxes, ended, listOrder } from './live.js';

export const STATUSES = ['queued', 'provisioning', 'running', 'paused', 'stopped', 'terminating', 'terminated', 'failed'];
const SCOPES = ['sandboxes:read', 'sandboxes:write', 'sandboxes:exec', 'files:read', 'files:write'];

/** The sandbox id an event is about, wherever its shape puts it. */
export function eventSandboxId(data) {
  if (!data || typeof data !== 'object') return null;
  if (typeof data.sandboxId === 'string') return data.sandboxId;
  for (const v of Object.values(data)) {
    if (v && typeof v === 'object') {
      const found = eventSandboxId(v);
      if (found) return found;
    }
  }
  if (typeof data.id === 'string' && data.id.startsWith('sbx_')) return data.id;
  return null;
}

/**
 * Projects the key may create sandboxes in: those of its own organization (the API lists
 * and creates sandboxes in the key's organization only, whatever the key may administer),
 * and only its own project when the key is bound to one.
 */
async function projects(who) {
  const items = await orgProjects(who);
  if (who.projectId) {
    const own = items.find((p) => p.id === who.projectId);
    return [own || { id: who.projectId, name: who.projectId }];
  }
  return items.filter((p) => !who.orgId || p.orgId === who.orgId);
}

/** The projects of the key's organization it may list ([] when it may not). */
async function orgProjects(who) {
  try {
    return (await get(`/v1/projects${qs({ orgId: who.orgId, limit: 1000 })}`)).items;
  } catch {
    return [];
  }
}

const PROJECT_CHOICE = 'differently.createProject.';

/** The project this key last created a sandbox in from this tab, if it is still offered. */
function rememberedProject(who, projs) {
  const id = sessionStorage.getItem(PROJECT_CHOICE + who.id);
  return projs.some((p) => p.id === id) ? id : null;
}

function labelsText(labels) {
  return Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`).join(', ');
}

/** Statuses of a sandbox that may still change: the list loads these unless asked otherwise. */
const LIVE_STATUSES = STATUSES.filter((s) => s !== 'terminated' && s !== 'failed');

export async function sandboxes(ctx) {
  const { el, who, signal } = ctx;
  const params = new URLSearchParams(location.hash.split('?')[1] || '');
  const filter = { status: params.get('status') || '', label: params.get('label') || '', projectId: params.get('projectId') || '' };
  const withEnded = params.get('ended') === '1';
  const projs = await projects(who);

  const statusSel = h('select', { id: 'f-status', name: 'status' },
    h('option', { value: '' }, 'any'), STATUSES.map((s) => h('option', { value: s, selected: s === filter.status }, s)));
  const labelIn = h('input', { id: 'f-label', name: 'label', placeholder: 'key=value', value: filter.label });
  const projSel = h('select', { id: 'f-project', name: 'projectId' },
    h('option', { value: '' }, 'any'), projs.map((p) => h('option', { value: p.id, selected: p.id === filter.projectId }, p.name)));
  const endedBox = h('input', { type: 'checkbox', id: 'f-ended', name: 'ended', checked: withEnded });
  const filters = h('form', { class: 'row', role: 'search', 'aria-label': 'Filter sandboxes', onsubmit: (ev) => {
    ev.preventDefault();
    const q = qs({ status: statusSel.value, label: labelIn.value.trim(), projectId: projSel.value, ended: endedBox.checked ? '1' : '' });
    location.hash = `#/sandboxes${q}`;
  } },
  h('label', { for: 'f-status' }, 'Status', statusSel),
  h('label', { for: 'f-label' }, 'Label', labelIn),
  h('label', { for: 'f-project' }, 'Project', projSel),
  h('label', { class: 'inline', for: 'f-ended' }, endedBox, 'Include ended (terminated, failed)'),
  h('button', { type: 'submit' }, 'Filter'));

  const createMsg = h('div', { 'aria-live': 'polite' });
  const chosen = who.projectId || rememberedProject(who, projs);
  const cProj = h('select', { id: 'c-project', name: 'projectId' },
    projs.map((p) => h('option', { value: p.id, selected: p.id === chosen }, p.name)));
  const cTemplate = h('input', { id: 'c-template', name: 'template', placeholder: 'default' });
  const cLabels = h('input', { id: 'c-labels', name: 'labels', placeholder: 'team=web, env=dev' });
  const cTtl = h('input', { id: 'c-ttl', name: 'ttlSeconds', type: 'number', min: 1, max: 2592000, placeholder: 'default' });
  const create = h('form', { class: 'row', 'aria-label': 'Create a sandbox', onsubmit: async (ev) => {
    ev.preventDefault();
    const body = {};
    if (cProj.value) body.projectId = cProj.value;
    if (cTemplate.value.trim()) body.template = cTemplate.value.trim();
    if (cTtl.value) body.ttlSeconds = Number(cTtl.value);
    const labels = {};
    for (const part of cLabels.value.split(',').map((x) => x.trim()).filter(Boolean)) {
      const [k, ...v] = part.split('=');
      labels[k.trim()] = v.join('=').trim();
    }
    if (Object.keys(labels).length) body.labels = labels;
    try {
      const mark = live.mark();
      const sbx = await api('POST', '/v1/sandboxes', body);
      if (cProj.value) sessionStorage.setItem(PROJECT_CHOICE + who.id, cProj.value);
      live.record(sbx, mark);
      show(sbx.id);
      const now = live.view(sbx.id);
      replace(createMsg, h('p', { class: 'notice' }, 'Created ', h('a', { href: `#/sandbox/${sbx.id}` }, sbx.id), ` (${now.status}).`));
      announce(`Sandbox ${sbx.id} created, ${now.status}`);
      // The answer may predate changes the stream reported before it arrived, or that
      // happened before the stream was open: read it once more now that both are settled.
      reread(sbx.id);
    } catch (e) {
      replace(createMsg, errorBox(e));
    }
  } },
  h('label', { for: 'c-project' }, 'Project', cProj),
  h('label', { for: 'c-template' }, 'Template', cTemplate),
  h('label', { for: 'c-labels' }, 'Labels', cLabels),
  h('label', { for: 'c-ttl' }, 'TTL (s)', cTtl),
  h('button', { type: 'submit', disabled: !who.has('sandboxes:write') || !projs.length }, 'Create sandbox'));

  const liveState = h('span', { class: 'muted', id: 'live-state' }, 'connecting…');
  const tbody = h('tbody', { id: 'sandbox-rows' });
  const rows = new Map();
  const live = new LiveSandboxes();
  const more = h('div');
  const empty = h('p', { class: 'muted', id: 'sandboxes-empty' });
  const heads = ['Id', 'Status', 'Reason', 'Pool', 'Project', 'Labels', 'Created'];
  const tbl = h('table', { id: 'sandboxes' }, h('caption', { class: 'visually-hidden' }, 'Sandboxes, live first, newest first'),
    h('thead', {}, h('tr', {}, heads.map((x) => h('th', { scope: 'col' }, x)))), tbody);

  function matches(sbx) {
    if (filter.status && sbx.status !== filter.status) return false;
    if (filter.projectId && sbx.projectId !== filter.projectId) return false;
    if (filter.label) {
      const [k, ...v] = filter.label.split('=');
      if ((sbx.labels || {})[k] !== v.join('=')) return false;
    }
    return true;
  }
  function row(sbx) {
    return h('tr', { 'data-id': sbx.id, 'data-status': sbx.status, class: ended(sbx) ? 'ended' : null },
      h('td', {}, h('a', { href: `#/sandbox/${sbx.id}`, class: 'mono' }, sbx.id)),
      h('td', {}, badge(sbx.status)),
      h('td', {}, sbx.statusReason || ''),
      h('td', {}, sbx.pool || '—'),
      h('td', { class: 'mono' }, sbx.projectId),
      h('td', {}, labelsText(sbx.labels)),
      h('td', {}, time(sbx.createdAt)));
  }
  /** Puts every shown row in the list's order (moving nodes, not rebuilding them). */
  function order() {
    const shown = [...rows.keys()].map((id) => live.view(id)).sort(listOrder);
    for (const sbx of shown) tbody.append(rows.get(sbx.id));
    empty.textContent = shown.length ? '' : (withEnded || filter.status
      ? 'No sandboxes match.' : 'No live sandboxes match. Tick “Include ended” to see terminated and failed ones.');
  }
  /** Shows `id` as the newest known state says (or hides it when the filter no longer matches). */
  function show(id, quiet) {
    const sbx = live.view(id);
    if (!sbx) return;
    const old = rows.get(id);
    if (!matches(sbx)) {
      if (old) { old.remove(); rows.delete(id); order(); }
      return;
    }
    if (old && old.dataset.status === sbx.status && old.dataset.pool === (sbx.pool || '') && old.dataset.reason === (sbx.statusReason || '')) return;
    const fresh = row(sbx);
    fresh.dataset.pool = sbx.pool || '';
    fresh.dataset.reason = sbx.statusReason || '';
    if (old) old.replaceWith(fresh);
    rows.set(id, fresh);
    if (!quiet) order();
    if (old && old.dataset.status !== sbx.status) announce(`${id} is ${sbx.status}`);
  }

  // What is loaded: one page source per status asked (every live status by default, so a
  // long history of ended sandboxes never hides the live ones behind "More").
  const statuses = filter.status ? [filter.status] : withEnded ? [''] : LIVE_STATUSES;
  let cursors = new Map(statuses.map((s) => [s, undefined]));
  async function loadPages(first) {
    if (first) cursors = new Map(statuses.map((s) => [s, undefined]));
    const mark = live.mark();
    const pages = await Promise.all([...cursors].map(async ([status, cursor]) => [status,
      await get(`/v1/sandboxes${qs({ ...filter, status, limit: 200, cursor })}`)]));
    for (const [status, page] of pages) {
      for (const sbx of page.items) if (live.record(sbx, mark)) show(sbx.id, true);
      if (page.nextCursor) cursors.set(status, page.nextCursor); else cursors.delete(status);
    }
    order();
    replace(more, cursors.size
      ? h('button', { type: 'button', class: 'secondary', onclick: () => loadPages(false).catch((e) => more.append(errorBox(e))) }, 'More')
      : null);
  }

  // Coalesced reads of one sandbox: an event that arrives while a read is under way asks for
  // one more read after it, never for nothing.
  const reading = new Map();
  async function reread(id) {
    if (reading.has(id)) { reading.set(id, true); return; }
    reading.set(id, false);
    try {
      do {
        reading.set(id, false);
        const mark = live.mark();
        try {
          if (live.record(await get(`/v1/sandboxes/${encodeURIComponent(id)}`), mark)) show(id);
        } catch { return; /* gone, or not this key's */ }
      } while (reading.get(id));
    } finally { reading.delete(id); }
  }

  replace(el,
    h('h1', {}, 'Sandboxes'),
    h('section', { class: 'panel', 'aria-labelledby': 'create-h' }, h('h2', { id: 'create-h' }, 'Create'), create, createMsg),
    filters,
    h('p', {}, 'Live updates: ', liveState),
    tbl, empty, more);

  // The stream opens first and the list is read once it is live, so no change falls between
  // the two; if it takes long, the list is read anyway and read again once the stream is live.
  let opened;
  const isLive = new Promise((resolve) => { opened = resolve; });
  let listMark = 0;
  sse(`/v1/events${qs({ projectId: filter.projectId })}`, ({ data }) => {
    const id = eventSandboxId(data);
    if (!id) return;
    if (live.event(data)) {
      if (live.has(id)) show(id); else reread(id);
    } else if (!live.has(id) && data && typeof data.statusVersion !== 'number') {
      reread(id);
    }
  }, signal, (state) => {
    liveState.textContent = state;
    if (state !== 'live') return;
    opened();
    // (Re)connected: what changed while the stream was not open is read again.
    if (listMark) loadPages(true).catch(() => {});
  }).catch(() => { liveState.textContent = 'off'; });
  await Promise.race([isLive, new Promise((r) => setTimeout(r, 3000))]);
  listMark = live.mark();
  await loadPages(true);
}

export async function snapshots(ctx) {
  const { el, who } = ctx;
  const msg = h('div', { 'aria-live': 'polite' });
  const list = h('div');
  async function load() {
    const page = await get(`/v1/snapshots${qs({ limit: 200 })}`);
    replace(list, table('Snapshots', [
      ['Id', (s) => h('span', { class: 'mono' }, s.id)],
      ['Name', (s) => s.name || ''],
      ['Status', (s) => badge(s.status)],
      ['Reason', (s) => s.statusReason || ''],
      ['Sandbox', (s) => h('a', { href: `#/sandbox/${s.sandboxId}`, class: 'mono' }, s.sandboxId)],
      ['Pool', (s) => s.pool],
      ['Created', (s) => time(s.createdAt)],
      ['Actions', (s) => h('span', { class: 'row' },
        h('button', { type: 'button', disabled: s.status !== 'ready' || !who.has('sandboxes:write'), 'aria-label': `Restore ${s.id} into a new sandbox`, onclick: async () => {
          try {
            const sbx = await api('POST', '/v1/sandboxes', { fromSnapshot: s.id });
            replace(msg, h('p', { class: 'notice' }, 'Restored into ', h('a', { href: `#/sandbox/${sbx.id}` }, sbx.id)));
          } catch (e) { replace(msg, errorBox(e)); }
        } }, 'Restore'),
        h('button', { type: 'button', class: 'danger', disabled: !who.has('sandboxes:write'), 'aria-label': `Delete snapshot ${s.id}`, onclick: async () => {
          try { await api('DELETE', `/v1/snapshots/${s.id}`); announce(`Snapshot ${s.id} deleted`); await load(); } catch (e) { replace(msg, errorBox(e)); }
        } }, 'Delete'))],
    ], page.items, 'No snapshots. Take one from a sandbox\'s page.'));
  }
  replace(el, h('h1', {}, 'Snapshots'), msg, list);
  await load();
}

/** A key's E2B alias: `e2b_` and the hex of its bytes (api/src/facade/e2b/alias.rs). */
export function e2bAlias(key) {
  return 'e2b_' + [...new TextEncoder().encode(key)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

export async function keys(ctx) {
  const { el, who } = ctx;
  const msg = h('div', { 'aria-live': 'polite' });
  const list = h('div');
  const projs = await orgProjects(who);
  const nameIn = h('input', { id: 'k-name', name: 'name', required: true, maxlength: 100 });
  const projSel = h('select', { id: 'k-project', name: 'projectId' },
    h('option', { value: '' }, 'whole organization'), projs.map((p) => h('option', { value: p.id }, p.name)));
  const boxes = SCOPES.map((s) => h('input', { type: 'checkbox', id: `k-scope-${s}`, value: s, checked: s.endsWith(':read') }));
  const scopeSet = h('fieldset', {}, h('legend', {}, 'Scopes'),
    boxes.map((b) => h('label', { class: 'inline', for: b.id }, b, b.value)));
  const form = h('form', { 'aria-label': 'Create a key', onsubmit: async (ev) => {
    ev.preventDefault();
    const body = { orgId: who.orgId, name: nameIn.value.trim(), scopes: boxes.filter((b) => b.checked).map((b) => b.value) };
    if (projSel.value) body.projectId = projSel.value;
    try {
      const k = await api('POST', '/v1/keys', body);
      nameIn.value = '';
      replace(msg, h('div', { class: 'notice', role: 'alert' },
        h('p', {}, `Key ${k.name} (${k.id}) created. This is the only time its secret is shown; copy it now:`),
        h('p', { class: 'secret', id: 'new-secret' }, k.key),
        h('button', { type: 'button', class: 'secondary', onclick: async (e2) => {
          try { await navigator.clipboard.writeText(k.key); e2.target.textContent = 'Copied'; } catch { e2.target.textContent = 'Copy failed: select the text'; }
        } }, 'Copy'),
        h('p', {}, 'For E2B SDKs that accept only e2b_ keys (docs/e2b-facade.md), the same key as its E2B alias:'),
        h('p', { class: 'secret', id: 'new-secret-e2b' }, e2bAlias(k.key)),
        h('button', { type: 'button', class: 'secondary', onclick: () => replace(msg) }, 'Done, hide it')));
      await load();
    } catch (e) { replace(msg, errorBox(e)); }
  } },
  h('div', { class: 'row' }, h('label', { for: 'k-name' }, 'Name', nameIn), h('label', { for: 'k-project' }, 'Project', projSel)),
  scopeSet, h('button', { type: 'submit' }, 'Create key'));

  async function load() {
    const page = await get(`/v1/keys${qs({ orgId: who.orgId, limit: 200 })}`);
    replace(list, table('Keys', [
      ['Id', (k) => h('span', { class: 'mono' }, k.id)],
      ['Name', (k) => k.name],
      ['Project', (k) => k.projectId || 'whole organization'],
      ['Scopes', (k) => k.scopes.join(', ')],
      ['Created', (k) => time(k.createdAt)],
      ['Last used', (k) => time(k.lastUsedAt)],
      ['State', (k) => (k.revokedAt ? h('span', { class: 'badge bad' }, 'revoked') : h('span', { class: 'badge ok' }, 'active'))],
      ['Actions', (k) => (k.revokedAt || k.id === who.id ? '' : revokeButton(k))],
    ], page.items, 'No keys.'));
  }
  function revokeButton(k) {
    const b = h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke key ${k.name}`, onclick: async () => {
      if (b.dataset.armed !== '1') {
        b.dataset.armed = '1';
        b.textContent = 'Confirm revoke';
        b.setAttribute('aria-label', `Confirm revoking key ${k.name}`);
        return;
      }
      try { await api('DELETE', `/v1/keys/${k.id}`); announce(`Key ${k.name} revoked`); await load(); } catch (e) { replace(msg, errorBox(e)); }
    } }, 'Revoke');
    return b;
  }
  replace(el, h('h1', {}, 'Keys'),
    h('section', { class: 'panel', 'aria-labelledby': 'newkey-h' }, h('h2', { id: 'newkey-h' }, 'Create a key'), form),
    msg, h('h2', {}, 'Keys of this organization'), list);
  await load();
}

const QUOTA_ROWS = [
  ['Active sandboxes', 'maxActive', ['active', 'activeSandboxes']],
  ['CPU', 'maxCpu', ['cpu']],
  ['Memory (MiB)', 'maxMemoryMiB', ['memoryMiB']],
  ['Disk (GiB)', 'maxDiskGiB', ['diskGiB']],
  ['Queued', 'maxQueued', ['queued']],
];

function quotaTable(title, q) {
  const usage = q.usage || {};
  const pick = (names) => { for (const n of names) if (usage[n] !== undefined) return usage[n]; return null; };
  return h('section', { class: 'panel', 'aria-label': title }, h('h2', {}, title),
    h('table', {}, h('caption', { class: 'visually-hidden' }, title),
      h('thead', {}, h('tr', {}, ['What', 'In use', 'Limit', ''].map((x) => h('th', { scope: 'col' }, x)))),
      h('tbody', {}, QUOTA_ROWS.map(([label, limitKey, useKeys]) => {
        const used = pick(useKeys);
        const limit = q[limitKey];
        return h('tr', {}, h('th', { scope: 'row' }, label), h('td', { class: 'num' }, used ?? '—'),
          h('td', { class: 'num' }, limit ?? 'no limit'),
          h('td', {}, typeof used === 'number' && typeof limit === 'number' && limit > 0
            ? h('meter', { min: 0, max: limit, value: Math.min(used, limit), 'aria-label': `${label} used` }) : ''));
      }))),
    h('details', {}, h('summary', {}, 'Everything the API answered'), kv(q)));
}

export async function quota(ctx) {
  const { el, who } = ctx;
  const parts = [h('h1', {}, 'Quota & usage')];
  try { parts.push(quotaTable('Organization', await get(`/v1/orgs/${who.orgId}/quota`))); } catch (e) { parts.push(errorBox(e)); }
  if (who.projectId) {
    try { parts.push(quotaTable('Project', await get(`/v1/projects/${who.projectId}/quota`))); } catch (e) { parts.push(errorBox(e)); }
  }
  replace(el, ...parts);
}
