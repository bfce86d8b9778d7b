// A small terminal over the PTY WebSocket (`GET /v1/sandboxes/{id}/pty`). Browsers cannot set
// headers on a WebSocket, so the key goes in the `Sec-WebSocket-Protocol` offer as
// `differently.bearer.<key>` next to `differently.pty.v1` (the one the server picks); never in
// the URL. Output is rendered as text (escape sequences dropped), never as markup.

import { getKey } from './api.js';
import { h, replace } from './dom.js';

const MAX_LINES = 2000;

/** A plain-text screen: lines, a cursor column, carriage return and backspace. */
export class Screen {
  constructor() { this.lines = ['']; this.col = 0; this.pending = ''; }

  write(text) {
    let t = this.pending + text;
    this.pending = '';
    // An escape sequence cut at the end of a chunk waits for the rest.
    const cut = t.lastIndexOf('\x1b');
    if (cut >= 0 && !/^\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])/.test(t.slice(cut))) {
      if (t.length - cut < 256) { this.pending = t.slice(cut); t = t.slice(0, cut); }
    }
    t = t.replace(/\x1b\[[0-?]*[ -/]*[@-~]/g, '')
      .replace(/\x1b\][^\x07\x1b]*(\x07|\x1b\\)/g, '')
      .replace(/\x1b[@-Z\\-_]/g, '');
    for (const ch of t) {
      const last = this.lines.length - 1;
      if (ch === '\n') { this.lines.push(''); this.col = 0; }
      else if (ch === '\r') { this.col = 0; }
      else if (ch === '\b') { this.col = Math.max(0, this.col - 1); }
      else if (ch === '\x07' || ch < ' ') { /* bell and other controls */ }
      else {
        const line = this.lines[last];
        this.lines[last] = line.slice(0, this.col).padEnd(this.col, ' ') + ch + line.slice(this.col + 1);
        this.col += 1;
      }
    }
    if (this.lines.length > MAX_LINES) this.lines.splice(0, this.lines.length - MAX_LINES);
  }

  text() { return this.lines.join('\n'); }
}

/** What a key press sends to the terminal, or null to let the browser have it. */
function keyBytes(ev) {
  if (ev.metaKey) return null;
  if (ev.ctrlKey && !ev.altKey && ev.key.length === 1) {
    const c = ev.key.toUpperCase().charCodeAt(0);
    if (c >= 64 && c <= 95) return String.fromCharCode(c - 64);
    return null;
  }
  const named = {
    Enter: '\r', Backspace: '\x7f', Tab: '\t', Escape: '\x1b',
    ArrowUp: '\x1b[A', ArrowDown: '\x1b[B', ArrowRight: '\x1b[C', ArrowLeft: '\x1b[D',
    Home: '\x1b[H', End: '\x1b[F', Delete: '\x1b[3~',
  };
  if (named[ev.key] !== undefined) return named[ev.key];
  if (ev.key.length === 1 && !ev.ctrlKey) return ev.key;
  return null;
}

/** Opens a terminal on sandbox `id` inside `container`; returns a function that closes it. */
export function openTerminal(container, id, announce) {
  const screen = new Screen();
  const out = h('pre', { class: 'terminal', id: 'terminal', tabindex: 0, role: 'log', 'aria-live': 'off',
    'aria-label': 'Terminal output; focus here and type to send keys' });
  const state = h('p', { id: 'terminal-state' }, 'Connecting…');
  const line = h('input', { id: 'terminal-line', name: 'line', autocomplete: 'off', spellcheck: 'false', size: 50 });
  const enc = new TextEncoder();
  const dec = new TextDecoder();
  const cols = 100;
  const rows = 24;
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const url = `${scheme}://${location.host}/v1/sandboxes/${encodeURIComponent(id)}/pty?cols=${cols}&rows=${rows}`;
  let opened = false;
  const ws = new WebSocket(url, ['differently.pty.v1', `differently.bearer.${getKey()}`]);
  ws.binaryType = 'arraybuffer';

  let frame = 0;
  function paint() {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      const atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      out.textContent = screen.text();
      if (atEnd) out.scrollTop = out.scrollHeight;
    });
  }
  function send(text) { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(text)); }
  function control(obj) { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(obj)); }

  ws.onmessage = (m) => {
    if (typeof m.data === 'string') {
      let msg = {};
      try { msg = JSON.parse(m.data); } catch { return; }
      if (msg.type === 'session') { opened = true; state.textContent = `Connected (session ${msg.id}).`; announce('Terminal connected'); }
      else if (msg.type === 'exit') { state.textContent = `The program exited with code ${msg.exitCode}.`; announce(state.textContent); }
      else if (msg.type === 'error') { state.textContent = `Terminal error: ${msg.code}: ${msg.message}`; announce(state.textContent); }
      return;
    }
    screen.write(dec.decode(new Uint8Array(m.data), { stream: true }));
    paint();
  };
  ws.onclose = () => {
    if (!opened) state.textContent = 'The terminal could not be opened: the sandbox must be running, its pool must offer exec.pty, and the key needs sandboxes:exec.';
    else if (state.textContent.startsWith('Connected')) state.textContent = 'Disconnected.';
  };
  out.addEventListener('keydown', (ev) => {
    const b = keyBytes(ev);
    if (b === null) return;
    ev.preventDefault();
    send(b);
  });
  out.addEventListener('paste', (ev) => {
    ev.preventDefault();
    send(ev.clipboardData.getData('text'));
  });
  const form = h('form', { class: 'row', 'aria-label': 'Send a line to the terminal', onsubmit: (ev) => {
    ev.preventDefault();
    send(`${line.value}\r`);
    line.value = '';
  } },
  h('label', { for: 'terminal-line' }, 'Send a line', line),
  h('button', { type: 'submit' }, 'Send'),
  h('button', { type: 'button', class: 'secondary', onclick: () => control({ type: 'signal', signal: 'INT' }) }, 'Interrupt (Ctrl-C)'),
  h('button', { type: 'button', class: 'secondary', onclick: () => ws.close() }, 'Close terminal'));
  replace(container, state, out, form);
  return () => { try { ws.close(); } catch { /* already closed */ } };
}
