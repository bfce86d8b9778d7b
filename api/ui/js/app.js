// The dashboard's shell: sign-in, navigation and the fragment router (`#/sandboxes`,
// `#/sandbox/sbx_…`). Views live in tenant.js, sandbox.js and operator.js.

import { clearKey, getKey, setKey, whoami, ApiError } from './api.js';
import { h, replace, errorBox } from './dom.js';
import * as tenant from './tenant.js';
import * as sandbox from './sandbox.js';
import * as operator from './operator.js';

/** Every view: fragment name, title, whether it needs an operator key, render function. */
const VIEWS = [
  { name: 'sandboxes', title: 'Sandboxes', group: 'tenant', render: tenant.sandboxes },
  { name: 'snapshots', title: 'Snapshots', group: 'tenant', render: tenant.snapshots },
  { name: 'keys', title: 'Keys', group: 'tenant', render: tenant.keys,
    // The API lets an admin, or an org-wide key with sandboxes:write, manage keys.
    allowed: (w) => w.admin || (!w.projectId && w.has('sandboxes:write')),
    refusal: 'Managing keys needs an organization-wide key with sandboxes:write (or an admin key).' },
  { name: 'quota', title: 'Quota & usage', group: 'tenant', render: tenant.quota },
  { name: 'pools', title: 'Pools', group: 'operator', render: operator.pools },
  { name: 'queue', title: 'Queue', group: 'operator', render: operator.queue },
  { name: 'policies', title: 'Policies', group: 'operator', render: operator.policies },
  { name: 'audit', title: 'Audit', group: 'operator', render: operator.audit },
  { name: 'trust', title: 'Trust report', group: 'operator', render: operator.trust },
  { name: 'secrets', title: 'Secrets', group: 'operator', render: operator.secrets },
];
const HIDDEN = { sandbox: { title: 'Sandbox', group: 'tenant', render: sandbox.page } };

let who = null;
let cleanup = null;

function main() { return document.getElementById('main'); }

function signInView(message) {
  document.title = 'Sign in · Differently';
  replace(document.getElementById('nav'));
  replace(document.getElementById('who'));
  const input = h('input', { id: 'key', name: 'key', type: 'password', autocomplete: 'off', spellcheck: 'false',
    required: true, size: 60, 'aria-describedby': 'key-help' });
  const form = h('form', { class: 'panel', 'aria-labelledby': 'signin-title', onsubmit: async (ev) => {
    ev.preventDefault();
    setKey(input.value.trim());
    input.value = '';
    await start();
  } },
  h('h1', { id: 'signin-title' }, 'Sign in'),
  message ? errorBox(message) : null,
  h('label', { for: 'key' }, 'API key', input),
  h('p', { id: 'key-help', class: 'muted' },
    'The key stays in this tab\'s session storage and is sent only as a bearer header to this server. ',
    'Closing the tab forgets it.'),
  h('button', { type: 'submit' }, 'Sign in'));
  replace(main(), form);
  input.focus();
}

function nav(current) {
  const items = [];
  for (const group of ['tenant', 'operator']) {
    if (group === 'operator' && !who.admin) continue;
    items.push(h('li', { class: 'group', 'aria-hidden': 'true' }, group === 'tenant' ? 'Tenant' : 'Operator'));
    for (const v of VIEWS.filter((x) => x.group === group && (!x.allowed || x.allowed(who)))) {
      items.push(h('li', {}, h('a', { href: `#/${v.name}`, 'aria-current': v.name === current ? 'page' : null }, v.title)));
    }
  }
  replace(document.getElementById('nav'), h('ul', {}, items));
  replace(document.getElementById('who'),
    h('span', {}, who.admin ? 'Operator · ' : 'Tenant · ', h('span', { class: 'mono' }, who.name)),
    h('button', { type: 'button', class: 'secondary', onclick: () => { clearKey(); who = null; location.hash = '#/'; signInView(); } }, 'Sign out'));
}

async function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  if (!who) return;
  const [, name = 'sandboxes', ...rest] = (location.hash || '#/sandboxes').slice(1).split('?')[0].split('/');
  const view = VIEWS.find((v) => v.name === name) || HIDDEN[name] || VIEWS[0];
  nav(view.name || name);
  document.title = `${view.title} · Differently`;
  const el = main();
  replace(el, h('p', {}, 'Loading…'));
  if (view.group === 'operator' && !who.admin) {
    replace(el, h('h1', {}, view.title),
      h('p', { class: 'error', role: 'alert' }, 'This view needs an operator (admin) key; this key is a tenant key.'));
    return;
  }
  if (view.allowed && !view.allowed(who)) {
    replace(el, h('h1', {}, view.title), h('p', { class: 'error', role: 'alert' }, view.refusal));
    return;
  }
  const controller = new AbortController();
  cleanup = () => controller.abort();
  try {
    await view.render({ who, signal: controller.signal, el }, rest.map(decodeURIComponent));
  } catch (e) {
    if (controller.signal.aborted) return;
    if (e instanceof ApiError && e.status === 401) { clearKey(); who = null; signInView(e); return; }
    el.append(errorBox(e));
  }
  if (location.hash.startsWith('#/') && document.activeElement === document.body) el.focus({ preventScroll: true });
}

async function start() {
  if (!getKey()) { signInView(); return; }
  try {
    who = await whoami();
  } catch (e) {
    clearKey();
    signInView(e);
    return;
  }
  if (!location.hash || location.hash === '#/') {
    location.hash = '#/sandboxes'; // routed by the hashchange
    return;
  }
  await route();
}

window.addEventListener('hashchange', route);
start();
