// DOM helpers. Every piece of data reaches the page as a text node or an attribute value,
// never as markup: nothing in the dashboard parses an HTML string (a unit test checks).

/** Builds an element: `h('a', {href: '#/x', onclick: fn}, 'text', child)`. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** Builds an SVG element (charts). */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') {
      el.addEventListener(k.slice(2), v);
    } else if (k === 'value' && 'value' in el) {
      el.value = v;
    } else if (k === 'checked' && 'checked' in el) {
      el.checked = Boolean(v);
    } else {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces the children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** A status badge: text plus a class per status (color is never the only signal). */
export function badge(status) {
  return h('span', { class: `badge s-${String(status).replace(/[^a-z]/g, '')}` }, String(status));
}

/** A time as local text with the ISO form in a `<time>` element. */
export function time(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  const d = new Date(iso);
  return h('time', { datetime: iso, title: iso }, isNaN(d) ? iso : d.toLocaleString());
}

/** How long ago `iso` was, in words. */
export function ago(iso) {
  if (!iso) return '—';
  const s = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** A table: `columns` are `[heading, cell(row) -> node|string, class?]`. */
export function table(caption, columns, rows, empty = 'Nothing here yet.') {
  if (!rows.length) return h('p', { class: 'muted' }, empty);
  return h('table', {},
    h('caption', { class: 'visually-hidden' }, caption),
    h('thead', {}, h('tr', {}, columns.map(([head, , cls]) => h('th', { scope: 'col', class: cls }, head)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, columns.map(([, cell, cls]) => h('td', { class: cls }, cell(r)))))));
}

/** Any JSON value as a definition list (nested objects indented), for documents whose
 * shape the dashboard does not need to know field by field. */
export function kv(value) {
  if (value === null || value === undefined) return h('span', { class: 'muted' }, '—');
  if (Array.isArray(value)) {
    if (!value.length) return h('span', { class: 'muted' }, 'none');
    if (value.every((v) => typeof v !== 'object' || v === null)) return value.join(', ');
    return h('ol', {}, value.map((v) => h('li', {}, kv(v))));
  }
  if (typeof value === 'object') {
    const entries = Object.entries(value);
    if (!entries.length) return h('span', { class: 'muted' }, 'none');
    return h('dl', { class: 'kv' }, entries.map(([k, v]) => [h('dt', {}, k), h('dd', {}, kv(v))]));
  }
  return String(value);
}

/** An error box for a failed call. */
export function errorBox(e) {
  const code = e && e.code ? `${e.code}: ` : '';
  return h('p', { class: 'error', role: 'alert' }, `${code}${e && e.message ? e.message : String(e)}`);
}

/** Announces `text` to screen readers (and shows it briefly). */
export function announce(text) {
  const el = document.getElementById('status');
  if (!el) return;
  el.textContent = text;
  clearTimeout(announce.timer);
  announce.timer = setTimeout(() => { el.textContent = ''; }, 4000);
}
