// Small SVG line charts, drawn with DOM calls (no markup strings), each with a text summary
// and its data as a table for people who do not see the picture.

import { h, s } from './dom.js';

const W = 640;
const H = 200;
const PAD = { l: 48, r: 12, t: 12, b: 28 };

/** `series`: `[{name, points: [[timeMs, value], …]}]` (up to 3). */
export function lineChart(title, unit, series) {
  const all = series.flatMap((x) => x.points);
  const id = `chart-${title.toLowerCase().replace(/[^a-z0-9]+/g, '-')}`;
  if (all.length < 2) {
    return h('figure', { id }, h('figcaption', {}, title), h('p', { class: 'muted' }, 'Collecting samples… (one every few seconds while this page is open)'));
  }
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(...all.map((p) => p[0]));
  const vmax = Math.max(1, ...all.map((p) => p[1]));
  const x = (t) => PAD.l + ((t - t0) / Math.max(1, t1 - t0)) * (W - PAD.l - PAD.r);
  const y = (v) => H - PAD.b - (v / vmax) * (H - PAD.t - PAD.b);
  const ticks = [0, vmax / 2, vmax];
  const latest = series.map((sr) => `${sr.name} ${fmt(sr.points.length ? sr.points[sr.points.length - 1][1] : 0)}`).join(', ');
  const svg = s('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': `${id}-t ${id}-d` },
    s('title', { id: `${id}-t` }, title),
    s('desc', { id: `${id}-d` }, `Latest: ${latest} (${unit}), over the last ${Math.round((t1 - t0) / 1000)} s`),
    ticks.map((v) => [
      s('line', { class: 'grid', x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v) }),
      s('text', { x: PAD.l - 6, y: y(v) + 4, 'text-anchor': 'end' }, fmt(v)),
    ]),
    s('line', { class: 'axis', x1: PAD.l, x2: PAD.l, y1: PAD.t, y2: H - PAD.b }),
    s('line', { class: 'axis', x1: PAD.l, x2: W - PAD.r, y1: H - PAD.b, y2: H - PAD.b }),
    s('text', { x: PAD.l, y: H - 8 }, new Date(t0).toLocaleTimeString()),
    s('text', { x: W - PAD.r, y: H - 8, 'text-anchor': 'end' }, new Date(t1).toLocaleTimeString()),
    series.map((sr, i) => s('polyline', { class: `l${i}`, points: sr.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(' ') })));
  const rows = [];
  const times = [...new Set(all.map((p) => p[0]))].sort((a, b) => b - a).slice(0, 20);
  for (const t of times) {
    rows.push(h('tr', {}, h('th', { scope: 'row' }, new Date(t).toLocaleTimeString()),
      series.map((sr) => { const p = sr.points.find((q) => q[0] === t); return h('td', { class: 'num' }, p ? fmt(p[1]) : ''); })));
  }
  return h('figure', { id },
    h('figcaption', {}, title, ` (${unit})`),
    h('ul', { class: 'legend' }, series.map((sr, i) => h('li', { class: `k${i}` }, i === 0 ? '━ ' : i === 1 ? '╍ ' : '┅ ', sr.name))),
    svg,
    h('details', {}, h('summary', {}, 'The samples as a table'),
      h('table', {}, h('caption', { class: 'visually-hidden' }, title),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Time'), series.map((sr) => h('th', { scope: 'col', class: 'num' }, sr.name)))),
        h('tbody', {}, rows))));
}

function fmt(v) {
  if (!Number.isFinite(v)) return '—';
  return Math.abs(v) >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toFixed(2);
}
