// Operator views (admin key): pools and their health, the fair queue per organization with
// charts, policies, the audit log (verify, export), the trust report and secrets.

import { get, getAll, qs, raw } from './api.js';
import { h, replace, time, table, kv, errorBox, announce, ago } from './dom.js';
import { lineChart } from './chart.js';

/** The pool-health strip: one tile per pool, healthy or not, in words as well as color. */
export function healthStrip(pools) {
  return h('ul', { class: 'strip', id: 'pool-strip', 'aria-label': 'Pool health' }, pools.map((p) => h('li', { class: p.healthy ? 'ok' : 'bad' },
    h('strong', {}, p.name),
    p.healthy ? '● healthy' : '✕ unhealthy',
    h('br'),
    h('span', { class: 'muted' }, `${slotsText(p)} · ${p.kind}`))));
}

/** A pool's slots in words: how many are used, of how many ("3 of 10 slots used"). */
export function slotsText(p) {
  const used = p.usedSlots ?? 0;
  return p.maxConcurrent
    ? `${used} of ${p.maxConcurrent} slots used`
    : `${used} ${used === 1 ? 'slot' : 'slots'} used (no limit)`;
}

/** Every pool's warm classes as rows (pool, class with its counts), in each pool's matching
 * order; a pool whose classes cannot be read is left out rather than failing the page. */
async function warmRows(items) {
  const docs = await Promise.all(items.map((p) => get(`/v1/admin/pools/${encodeURIComponent(p.name)}/warm`).catch(() => null)));
  return items.flatMap((p, i) => ((docs[i] && docs[i].classes) || []).map((c) => ({ pool: p.name, ...c })));
}

/** A warm class's resources in words ("2 CPU · 2048 MiB · 5 GiB"); absent: a create's defaults. */
function warmResources(c) {
  const r = c.resources;
  return r ? `${r.cpu} CPU · ${r.memoryMiB} MiB · ${r.diskGiB} GiB` : 'defaults';
}

/** Claims per minute over the last 10 minutes, to one decimal ("0.3"; whole numbers bare). */
function claimsPerMinute(n) {
  const v = Number(n) || 0;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

/** The share of matching creates answered warm over the last 10 minutes ("75% hit"). */
function hitRatio(r) {
  return r === null || r === undefined
    ? h('span', { class: 'muted' }, 'no creates')
    : `${Math.round(r * 100)}% hit`;
}

/** A pool's detected backend version and how far its adapter is verified, with the basis. */
function backendText(p) {
  return [`${p.backendVersion || 'version not detected'} · ${p.verified || 'unknown'}`,
    h('div', { class: 'muted' }, p.verifiedBasis || '')];
}

export async function pools(ctx) {
  const { el } = ctx;
  const items = await getAll('/v1/admin/pools');
  const warm = await warmRows(items);
  replace(el, h('h1', {}, 'Pools'), healthStrip(items),
    table('Pools', [
      ['Name', (p) => h('strong', {}, p.name)],
      ['Kind', (p) => p.kind],
      ['Trust', (p) => p.trust],
      ['Region', (p) => p.region || 'any'],
      ['Health', (p) => (p.healthy ? h('span', { class: 'ok' }, 'healthy') : h('span', { class: 'bad' }, 'unhealthy'))],
      ['Last probe', (p) => (p.health ? [time(p.health.checkedAt), p.health.error ? h('div', { class: 'bad' }, p.health.error) : ''] : '—')],
      ['Capabilities', (p) => (p.capabilities || []).join(', ') || 'none'],
      ['Backend', (p) => backendText(p)],
      ['Slots', (p) => slotsText(p)],
      ['Source', (p) => p.source],
    ], items, 'No pools.'),
    h('h2', {}, 'Warm classes'),
    h('p', { class: 'muted' }, 'Instances kept ready per pool, so a create with the same template and resources starts from one; claims per minute and hit ratio are over the last 10 minutes. Set with PUT /v1/admin/pools/{name}/warm or warm = [...] in the config file.'),
    h('div', { id: 'warm-classes' }, table('Warm classes', [
      ['Pool', (c) => c.pool],
      ['Class', (c) => h('strong', {}, c.name)],
      ['Ready', (c) => h('span', { class: c.ready > 0 ? 'ok' : 'muted' }, `${c.ready} ready`), 'num'],
      ['Creating', (c) => `${c.creating} creating`, 'num'],
      ['Claims/min', (c) => `${claimsPerMinute(c.claimsPerMinute)}/min`, 'num'],
      ['Hit ratio', (c) => hitRatio(c.hitRatio), 'num'],
      ['Size', (c) => (c.maxSize && c.maxSize !== c.size ? `${c.size} (max ${c.maxSize})` : String(c.size)), 'num'],
      ['Template', (c) => c.template || 'pool default'],
      ['Resources', warmResources],
      ['Refill', (c) => `${c.refillPerSecond}/s`],
      ['Max age', (c) => `${c.maxAgeSeconds} s`],
    ], warm, 'No warm classes.')));
}

// Samples survive moving between views (not a reload): the charts show what this tab saw.
const samples = [];
const MAX_SAMPLES = 200;

async function sample() {
  const [q, m] = await Promise.all([get('/v1/admin/queue'), get('/v1/admin/metrics/summary')]);
  const sum = (o) => Object.values(o || {}).reduce((a, b) => a + b, 0);
  samples.push({ t: Date.now(), queued: q.total, admitted: (m.admissions || {}).admitted || 0, activated: sum(m.activations), enabled: m.enabled });
  if (samples.length > MAX_SAMPLES) samples.shift();
  return { q, m };
}

function rates(key) {
  const out = [];
  for (let i = 1; i < samples.length; i += 1) {
    const a = samples[i - 1]; const b = samples[i];
    const dt = (b.t - a.t) / 60000;
    if (dt > 0) out.push([b.t, Math.max(0, (b[key] - a[key]) / dt)]);
  }
  return out;
}

export async function queue(ctx) {
  const { el, signal } = ctx;
  const strip = h('div');
  const tableBox = h('div');
  const charts = h('div');
  const note = h('p', { class: 'muted' });
  replace(el, h('h1', {}, 'Fair queue'),
    h('p', {}, 'Organizations with less active CPU are served first, round-robin; inside one, higher priority, then older. ',
      'A waiting sandbox names the wall it waits behind: its org\'s quota, its project\'s, or full pools.'),
    strip, h('h2', {}, 'Waiting, per organization'), tableBox, h('h2', {}, 'Over time'), note, charts);
  async function tick() {
    try {
      const [{ q, m }, p] = await Promise.all([sample(), getAll('/v1/admin/pools')]);
      replace(strip, healthStrip(p));
      replace(tableBox,
        h('p', {}, `${q.total} queued${q.truncated ? ' (more than counted)' : ''}, as of `, time(q.generatedAt), '.'),
        table('Queue per organization', [
          ['Organization', (o) => [o.orgName || '', ' ', h('span', { class: 'mono muted' }, o.orgId)]],
          ['Depth', (o) => String(o.depth), 'num'],
          ['Oldest', (o) => [ago(o.oldestQueuedAt), ' · ', h('span', { class: 'mono' }, o.oldestSandboxId)]],
          ['Waiting behind', (o) => Object.entries(o.walls).map(([w, n]) => `${w}: ${n}`).join(', ')],
          ['Reasons', (o) => h('ul', {}, o.reasons.map((r) => h('li', {}, `${r.reason} (${r.count})`)))],
        ], q.orgs, 'Nobody is waiting.'));
      note.textContent = 'Sampled every 3 s while this page is open; the samples stay in this tab.';
      replace(charts,
        lineChart('Queue depth', 'sandboxes', [{ name: 'queued', points: samples.map((x) => [x.t, x.queued]) }]),
        m.enabled
          ? [lineChart('Admission and activation rate', 'per minute', [
            { name: 'admitted', points: rates('admitted') },
            { name: 'activated', points: rates('activated') },
          ]), h('p', { class: 'muted', id: 'rate-note' },
            'Admissions and activations are the counters of the API process that answers. In differently dev that is every role; ',
            'with separate processes, the scheduler counts activations, so the activated line stays at 0 here (chart the scheduler\'s ',
            h('code', {}, 'differently_activations_total'), ' in Prometheus).')]
          : h('figure', { id: 'chart-admission-and-activation-rate' },
            h('figcaption', {}, 'Admission and activation rate (per minute)'),
            h('p', { class: 'notice', id: 'metrics-off' },
              'No chart: the API process that answers keeps no metrics. In the production topology (separate processes) ',
              'counters are kept only when ', h('code', {}, '[metrics] listen'), ' is set in its configuration (or ',
              h('code', {}, 'DIFFERENTLY_METRICS_LISTEN'), '); set it and restart to chart admissions here. ',
              'The queue depth above comes from the store and needs no metrics.')));
    } catch (e) {
      replace(tableBox, errorBox(e));
    }
  }
  await tick();
  const timer = setInterval(() => { if (!document.hidden) tick(); }, 3000);
  signal.addEventListener('abort', () => clearInterval(timer));
}

async function orgs() {
  return (await get('/v1/orgs?limit=1000')).items;
}

export async function policies(ctx) {
  const { el } = ctx;
  const all = await orgs();
  const orgBox = h('div');
  const sel = h('select', { id: 'p-org', onchange: () => showOrg(sel.value) }, h('option', { value: '' }, 'choose…'), all.map((o) => h('option', { value: o.id }, o.name)));
  async function showOrg(id) {
    if (!id) { replace(orgBox); return; }
    try { replace(orgBox, kv(await get(`/v1/orgs/${id}/policy`))); } catch (e) { replace(orgBox, errorBox(e)); }
  }
  replace(el, h('h1', {}, 'Placement policies'),
    h('section', { class: 'panel', 'aria-labelledby': 'pg-h' }, h('h2', { id: 'pg-h' }, 'Global'), kv(await get('/v1/admin/policies/global'))),
    h('section', { class: 'panel', 'aria-labelledby': 'po-h' }, h('h2', { id: 'po-h' }, 'Per organization'),
      h('label', { for: 'p-org' }, 'Organization', sel), orgBox));
}

export async function audit(ctx) {
  const { el } = ctx;
  const all = await orgs();
  const verifyBox = h('div', { 'aria-live': 'polite' });
  const listBox = h('div');
  const orgSel = h('select', { id: 'a-org', name: 'orgId' }, all.map((o) => h('option', { value: o.id }, o.name)));
  const actionIn = h('input', { id: 'a-action', name: 'action', placeholder: 'e.g. sandbox.exec' });
  const resourceIn = h('input', { id: 'a-resource', name: 'resource', placeholder: 'sbx_… / key_…' });
  async function load() {
    try {
      const page = await get(`/v1/audit${qs({ orgId: orgSel.value, action: actionIn.value.trim(), resource: resourceIn.value.trim(), limit: 200 })}`);
      const items = page.items.slice().sort((a, b) => b.seq - a.seq);
      replace(listBox, table('Audit records', [
        ['Seq', (r) => String(r.seq), 'num'],
        ['When', (r) => time(r.at)],
        ['Actor', (r) => h('span', { class: 'mono' }, r.actor)],
        ['Action', (r) => r.action],
        ['Resource', (r) => h('span', { class: 'mono' }, r.resource)],
        ['Outcome', (r) => r.outcome],
        ['Detail', (r) => h('code', {}, JSON.stringify(r.detail))],
        ['Hash', (r) => h('span', { class: 'mono', title: r.hash }, `${r.hash.slice(0, 12)}…`)],
      ], items, 'No records match.'));
    } catch (e) { replace(listBox, errorBox(e)); }
  }
  async function verify() {
    replace(verifyBox, h('p', {}, 'Verifying every chain…'));
    try {
      const r = await get('/v1/admin/audit/verify');
      replace(verifyBox, h('div', { class: r.ok ? 'notice' : 'error', id: 'verify-result', role: 'status' },
        h('p', {}, h('strong', {}, r.ok ? 'The audit chain verifies.' : 'The audit chain does NOT verify.')),
        h('details', {}, h('summary', {}, 'Report'), kv(r))));
      announce(r.ok ? 'Audit chain verified' : 'Audit verification failed');
    } catch (e) { replace(verifyBox, errorBox(e)); }
  }
  async function exportAll() {
    try {
      const resp = await raw('/v1/admin/audit/export');
      const url = URL.createObjectURL(await resp.blob());
      const a = h('a', { href: url, download: `audit-${new Date().toISOString().slice(0, 19)}.jsonl` });
      document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      announce('Audit export downloaded');
    } catch (e) { replace(verifyBox, errorBox(e)); }
  }
  replace(el, h('h1', {}, 'Audit log'),
    h('div', { class: 'row' },
      h('button', { type: 'button', id: 'verify', onclick: verify }, 'Verify the chain'),
      h('button', { type: 'button', class: 'secondary', id: 'export', onclick: exportAll }, 'Export (JSON lines)')),
    verifyBox,
    h('form', { class: 'row', role: 'search', 'aria-label': 'Filter audit records', onsubmit: (ev) => { ev.preventDefault(); load(); } },
      h('label', { for: 'a-org' }, 'Organization', orgSel),
      h('label', { for: 'a-action' }, 'Action', actionIn),
      h('label', { for: 'a-resource' }, 'Resource', resourceIn),
      h('button', { type: 'submit' }, 'Show')),
    listBox);
  await load();
}

export async function trust(ctx) {
  const { el } = ctx;
  const r = await get('/v1/admin/trust-report');
  replace(el, h('h1', {}, 'Trust report'),
    h('p', {}, 'Generated ', time(r.generatedAt), ` for installation ${r.installationId}. Telemetry: ${r.telemetry}.`),
    h('h2', {}, 'Pools'),
    table('Pools and their declared trust', [
      ['Pool', (p) => h('strong', {}, p.name)],
      ['Kind', (p) => p.kind], ['Trust', (p) => p.trust], ['Region', (p) => p.region || 'any'],
      ['Isolation', (p) => p.isolation], ['Egress', (p) => p.egress], ['Endpoint', (p) => p.endpoint || '—'],
      ['Health', (p) => (p.healthy ? h('span', { class: 'ok' }, 'healthy') : h('span', { class: 'bad' }, 'unhealthy'))],
      ['Backend', (p) => backendText(p)],
      ['Credentials', (p) => (p.credentials.length ? h('ul', {}, p.credentials.map((c) => h('li', {}, `${c.reference} `, h('span', { class: 'mono' }, c.fingerprint || c.missing || c.why || '')))) : 'none')],
    ], r.pools),
    h('h2', {}, 'Work placed on external pools'),
    table('External placements', [
      ['Organization', (x) => x.orgId || x.org || ''], ['Pool', (x) => x.pool || ''], ['Sandboxes', (x) => String(x.count ?? x.sandboxes ?? ''), 'num'],
      ['Details', (x) => kv(x)],
    ], r.externalPlacements, 'No work ran on an external pool.'),
    h('h2', {}, 'What Differently does not enforce'),
    h('ul', {}, r.notEnforced.map((t) => h('li', {}, t))));
}

export async function secrets(ctx) {
  const { el } = ctx;
  const page = await get('/v1/admin/secrets');
  replace(el, h('h1', {}, 'Secrets'),
    h('p', {}, 'Backend credentials stored sealed. Only names and fingerprints are ever served; values never leave the server.'),
    table('Secrets', [
      ['Name', (x) => h('strong', {}, x.name)],
      ['Fingerprint', (x) => h('span', { class: 'mono' }, x.fingerprint || '')],
      ['Updated by', (x) => x.updatedBy || ''],
      ['Updated', (x) => time(x.updatedAt)],
    ], page.items || [], 'No stored secrets.'));
}
