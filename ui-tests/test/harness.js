// A real `differently dev` (devhost pool) on a free loopback port, the system's chromium
// driven by playwright-core (no browser download), and axe-core injected into each page.

import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const require = createRequire(import.meta.url);
export const HERE = dirname(fileURLToPath(import.meta.url));
export const REPO = resolve(HERE, '../..');
export const ARTIFACTS = process.env.DASHBOARD_ARTIFACTS || join(REPO, 'ui-tests/artifacts');
export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const AXE = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');

export async function startDev() {
  const bin = process.env.DIFFERENTLY_BIN || join(REPO, 'target/debug/differently');
  if (!existsSync(bin)) throw new Error(`the differently binary is missing at ${bin}: run \`cargo build -p differently\``);
  const dir = mkdtempSync(join(tmpdir(), 'differently-ui-'));
  const child = spawn(bin, ['dev', '--listen', '127.0.0.1:0', '--key-file', join(dir, 'key'), '--root', join(dir, 'root')], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG || 'warn', NO_COLOR: '1', DIFFERENTLY_SECRETS_KEY: randomBytes(32).toString('hex') },
  });
  let out = '';
  let err = '';
  child.stderr.setEncoding('utf8').on('data', (d) => { err = (err + d).slice(-200000); });
  const vars = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`differently dev printed no URL within 30 s:\n${err}`)), 30000);
    child.on('exit', (code) => { clearTimeout(timer); fail(new Error(`differently dev exited (${code}):\n${err}`)); });
    child.stdout.setEncoding('utf8').on('data', (d) => {
      out += d;
      const v = {};
      for (const m of out.matchAll(/^export (\w+)=(\S+)$/gm)) v[m[1]] = m[2];
      if (v.DIFFERENTLY_URL && v.DIFFERENTLY_API_KEY) { clearTimeout(timer); ok(v); }
    });
  });
  const url = vars.DIFFERENTLY_URL;
  for (const deadline = Date.now() + 30000; ;) {
    try { if ((await fetch(`${url}/readyz`)).ok) break; } catch { /* not yet */ }
    if (Date.now() > deadline) throw new Error(`never ready:\n${err}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const adminKey = vars.DIFFERENTLY_API_KEY;
  const call = async (method, path, body, key = adminKey) => {
    const headers = { Authorization: `Bearer ${key}` };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const r = await fetch(`${url}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await r.text();
    return { status: r.status, body: text ? JSON.parse(text) : null };
  };
  return {
    url, adminKey, call, log: () => err,
    stop: async () => {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 10000);
        await exited;
        clearTimeout(t);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export async function launch() {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`chromium is missing at ${CHROMIUM}: apt-get install -y chromium (or set CHROMIUM)`);
  }
  mkdirSync(ARTIFACTS, { recursive: true });
  // --no-sandbox: CI runs as root, where chromium's own sandbox cannot start.
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
}

/**
 * A page that fails the test on a script error or a CSP violation (the dashboard must work
 * under its own policy), with a `problems` list to assert empty.
 */
export async function newPage(browser, url) {
  const context = await browser.newContext({ baseURL: url, acceptDownloads: true });
  const page = await context.newPage();
  page.problems = [];
  page.on('pageerror', (e) => page.problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused to/i.test(m.text())) page.problems.push(`CSP: ${m.text()}`);
  });
  return page;
}

export async function signIn(page, key) {
  await page.goto('/ui/');
  await page.getByLabel('API key').waitFor();
  await axeCheck(page, 'sign-in');
  await page.getByLabel('API key').fill(key);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
}

/** Runs axe on the page as it is; fails on serious or critical violations. */
export async function axeCheck(page, name) {
  await page.evaluate(AXE);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
  const bad = result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
  if (bad.length) {
    const text = bad.map((v) => `${v.impact} ${v.id}: ${v.help}\n  ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join('\n  ')}`).join('\n');
    throw new Error(`axe: ${bad.length} serious/critical violation(s) on ${name}:\n${text}`);
  }
}
