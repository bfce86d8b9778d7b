// The dashboard end to end: a real `differently dev`, the system's headless chromium, axe-core
// on every page. Screenshots go to ui-tests/artifacts/ (gitignored; CI keeps them).

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { axeCheck, launch, newPage, signIn, startDev } from './harness.js';

let dev;
let browser;
/** The bootstrap org's project, a tenant key bound to it, and another org's tenant. */
const t = {};

async function ok(res, what) {
  assert.ok(res.status < 300, `${what}: ${res.status} ${JSON.stringify(res.body)}\n${dev.log().slice(-3000)}`);
  return res.body;
}

before(async () => {
  dev = await startDev();
  browser = await launch();
  const orgs = await ok(await dev.call('GET', '/v1/orgs'), 'orgs');
  t.orgA = orgs.items[0].id;
  const projects = await ok(await dev.call('GET', `/v1/projects?orgId=${t.orgA}`), 'projects');
  t.projectA = projects.items[0].id;
  const scopes = ['sandboxes:read', 'sandboxes:write', 'sandboxes:exec', 'files:read', 'files:write'];
  // Org-wide (no project), so it may also manage its organization's keys.
  t.keyA = (await ok(await dev.call('POST', '/v1/keys', { orgId: t.orgA, name: 'tenant-a', scopes }), 'key A')).key;
  // Another organization with a sandbox of its own, which tenant A must never see.
  t.orgB = (await ok(await dev.call('POST', '/v1/orgs', { name: 'other-org' }), 'org B')).id;
  t.projectB = (await ok(await dev.call('POST', '/v1/projects', { orgId: t.orgB, name: 'b' }), 'project B')).id;
  t.keyB = (await ok(await dev.call('POST', '/v1/keys', { orgId: t.orgB, projectId: t.projectB, name: 'tenant-b', scopes }), 'key B')).key;
  t.sandboxB = (await ok(await dev.call('POST', '/v1/sandboxes', {}, t.keyB), 'sandbox B')).id;
});

after(async () => {
  if (browser) await browser.close();
  if (dev) await dev.stop();
});

describe('tenant', () => {
  let page;
  before(async () => { page = await newPage(browser, dev.url); });

  test('signs in and sees only tenant views', async () => {
    await signIn(page, t.keyA);
    await page.getByRole('heading', { name: 'Sandboxes', level: 1 }).waitFor();
    const nav = await page.locator('#nav').innerText();
    assert.match(nav, /Sandboxes/);
    assert.doesNotMatch(nav, /Pools|Trust report|Secrets/);
    // The key is in session storage, never in the URL or a cookie.
    assert.equal(await page.evaluate(() => sessionStorage.getItem('differently.apiKey')), t.keyA);
    assert.ok(!page.url().includes(t.keyA));
    assert.deepEqual(await page.context().cookies(), []);
    await axeCheck(page, 'tenant-sandboxes');
  });

  test('creates a sandbox and watches it reach running without reloading', async () => {
    await page.locator('#live-state', { hasText: 'live' }).waitFor();
    await page.evaluate(() => { window.__noReload = 'still here'; });
    await page.getByRole('button', { name: 'Create sandbox' }).click();
    const link = page.locator('.notice a[href^="#/sandbox/"]');
    await link.waitFor();
    t.sandboxA = (await link.innerText()).trim();
    await page.locator(`tr[data-id="${t.sandboxA}"][data-status="running"]`).waitFor({ timeout: 30000 });
    assert.equal(await page.evaluate(() => window.__noReload), 'still here', 'the page was reloaded');
    // Another organization's sandbox is not listed.
    assert.equal(await page.locator(`tr[data-id="${t.sandboxB}"]`).count(), 0);
    // The label filter: a sandbox created with a label is the only one listed under it.
    await page.getByLabel('Labels').fill('team=ui');
    await page.getByRole('button', { name: 'Create sandbox' }).click();
    await page.locator('.notice a[href^="#/sandbox/"]').filter({ hasNotText: t.sandboxA }).waitFor();
    const labelled = (await page.locator('.notice a[href^="#/sandbox/"]').innerText()).trim();
    await page.getByLabel('Label', { exact: true }).fill('team=ui');
    await page.getByRole('button', { name: 'Filter' }).click();
    await page.locator(`tr[data-id="${labelled}"]`).waitFor();
    await page.waitForFunction((id) => !document.querySelector(`tr[data-id="${id}"]`), t.sandboxA);
    // The status filter.
    await page.getByLabel('Label', { exact: true }).fill('');
    await page.getByLabel('Status').selectOption('failed');
    await page.getByRole('button', { name: 'Filter' }).click();
    await page.locator('p.muted, #sandboxes').first().waitFor();
    await page.waitForFunction((id) => !document.querySelector(`tr[data-id="${id}"]`), t.sandboxA);
  });

  test('a create answered after the stream reported running still shows running', async () => {
    // The create's answer is read at commit (provisioning); the sandbox runs milliseconds
    // later and the event stream says so before the answer reaches the page. Here the answer
    // is held until the page has shown the row as running, then delivered: the row must not
    // go back to the older status.
    await page.goto('/ui/#/sandboxes');
    await page.locator('#live-state', { hasText: 'live' }).waitFor();
    let answered = null;
    const isCreate = (url) => url.pathname === '/v1/sandboxes';
    await page.route(isCreate, async (route) => {
      if (route.request().method() !== 'POST') return route.fallback();
      const resp = await route.fetch();
      answered = await resp.json();
      try {
        await page.locator(`tr[data-id="${answered.id}"][data-status="running"]`).waitFor({ timeout: 30000 });
      } finally {
        await route.fulfill({ response: resp, json: answered });
      }
    });
    await page.getByRole('button', { name: 'Create sandbox' }).click();
    for (const deadline = Date.now() + 60000; !answered;) {
      assert.ok(Date.now() < deadline, 'the create never reached the held route');
      await new Promise((r) => setTimeout(r, 50));
    }
    await page.locator(`.notice a[href="#/sandbox/${answered.id}"]`).waitFor({ timeout: 60000 });
    await page.unroute(isCreate);
    assert.notEqual(answered.status, 'running', 'the answer must predate running for this test to mean anything');
    assert.equal((await page.locator('.notice a').innerText()).trim(), answered.id);
    // The answer has been applied (the notice is written with it): the row still says running.
    assert.equal(await page.locator(`tr[data-id="${answered.id}"]`).getAttribute('data-status'), 'running');
    assert.match(await page.locator('.notice').innerText(), /\(running\)/);
    assert.deepEqual(page.problems, []);
  });

  test('the list shows live sandboxes first, newest first; ended ones only when asked, after them', async () => {
    const mk = async () => (await ok(await dev.call('POST', '/v1/sandboxes', { projectId: t.projectA, labels: { order: 'd' } }, t.keyA), 'create')).id;
    const oldest = await mk();
    const middle = await mk();
    const newest = await mk();
    await ok(await dev.call('DELETE', `/v1/sandboxes/${oldest}`, undefined, t.keyA), 'delete');
    await ok(await dev.call('GET', `/v1/sandboxes/${oldest}/wait?status=terminated&timeoutSeconds=60`, undefined, t.keyA), 'wait terminated');
    const ids = () => page.locator('#sandbox-rows tr').evaluateAll((trs) => trs.map((tr) => tr.dataset.id));

    await page.goto('/ui/#/sandboxes?label=order%3Dd');
    await page.locator(`tr[data-id="${newest}"]`).waitFor();
    await page.locator(`tr[data-id="${middle}"]`).waitFor();
    assert.deepEqual(await ids(), [newest, middle], 'live ones, newest first, and no ended one by default');

    await page.getByLabel('Include ended (terminated, failed)').check();
    await page.getByRole('button', { name: 'Filter' }).click();
    await page.locator(`tr[data-id="${oldest}"]`).waitFor();
    assert.deepEqual(await ids(), [newest, middle, oldest], 'ended ones after the live ones');
    assert.equal(await page.locator(`tr[data-id="${oldest}"]`).getAttribute('data-status'), 'terminated');
    // A live one that ends while watched moves behind the live ones.
    await ok(await dev.call('DELETE', `/v1/sandboxes/${newest}`, undefined, t.keyA), 'delete newest');
    await page.locator(`tr[data-id="${newest}"][data-status="terminated"]`).waitFor({ timeout: 30000 });
    assert.deepEqual(await ids(), [middle, newest, oldest]);
    await axeCheck(page, 'tenant-sandboxes-ordered');
    assert.deepEqual(page.problems, []);
  });

  test('sandbox page: placement explanation, terminal, recent execs, files', async () => {
    // A file put through the API shows in the files browser.
    const put = await fetch(`${dev.url}/v1/sandboxes/${t.sandboxA}/files?path=/hello-ui.txt`, {
      method: 'PUT', headers: { Authorization: `Bearer ${t.keyA}` }, body: 'hello from the API',
    });
    assert.equal(put.status, 204, await put.text());
    await page.goto(`/ui/#/sandbox/${t.sandboxA}`);
    await page.locator('section[aria-labelledby="files-h"] td', { hasText: 'hello-ui.txt' }).waitFor();
    // A mode reads in octal, as `ls` shows it and the upload's `mode=` takes it (the API's 420).
    const fileRow = page.locator('section[aria-labelledby="files-h"] tr', { hasText: 'hello-ui.txt' });
    assert.match(await fileRow.innerText(), /\b0644\b/);
    const [download] = await Promise.all([
      page.waitForEvent('download'),
      page.getByRole('button', { name: 'Download /hello-ui.txt' }).click(),
    ]);
    const { readFileSync } = await import('node:fs');
    assert.equal(readFileSync(await download.path(), 'utf8'), 'hello from the API');
    await page.locator('#placement-decision').waitFor();
    assert.equal(await page.locator('#placement-decision').innerText(), 'placed');
    assert.match(await page.locator('#placement').innerText(), /local/);
    await page.getByRole('button', { name: 'Open terminal' }).click();
    await page.locator('#terminal-state', { hasText: 'Connected' }).waitFor({ timeout: 15000 });
    await page.locator('#terminal').focus();
    await page.keyboard.type('echo ui-$((6*7))');
    await page.keyboard.press('Enter');
    await page.locator('#terminal', { hasText: 'ui-42' }).waitFor({ timeout: 15000 });
    await axeCheck(page, 'tenant-sandbox');
    // The terminal's open is in the audit log's recent execs (after a re-read).
    await page.reload();
    await page.locator('#execs-h').waitFor();
    await page.locator('section[aria-labelledby="execs-h"]', { hasText: 'pty' }).waitFor({ timeout: 10000 });
    await page.locator('section[aria-labelledby="history-h"] table').waitFor();
    // The file upload is an audit record, not a status change: listed under its own heading.
    await page.locator('section[aria-labelledby="activity-h"]', { hasText: 'file.upload' }).waitFor();
    assert.doesNotMatch(await page.locator('section[aria-labelledby="history-h"]').innerText(), /file\.upload/);
    // Long audit details wrap inside the status history's panel instead of running past it.
    const over = await page.locator('section[aria-labelledby="history-h"]').evaluate(
      (s) => s.querySelector('table').getBoundingClientRect().right - s.getBoundingClientRect().right);
    assert.ok(over <= 1, `the status history runs ${over}px past its panel`);
  });

  test('status history lists status changes only; requests and other records have their own list', async () => {
    const id = (await ok(await dev.call('POST', '/v1/sandboxes', { projectId: t.projectA }, t.keyA), 'create')).id;
    await ok(await dev.call('GET', `/v1/sandboxes/${id}/wait?status=running&timeoutSeconds=60`, undefined, t.keyA), 'wait running');
    await ok(await dev.call('POST', `/v1/sandboxes/${id}/pause`, undefined, t.keyA), 'pause');
    await ok(await dev.call('GET', `/v1/sandboxes/${id}/wait?status=paused&timeoutSeconds=60`, undefined, t.keyA), 'wait paused');
    await page.goto(`/ui/#/sandbox/${id}`);
    const historyBox = page.locator('section[aria-labelledby="history-h"]');
    await historyBox.locator('td', { hasText: 'paused' }).first().waitFor();
    const rows = await historyBox.locator('tbody tr').evaluateAll((trs) => trs.map((tr) => tr.children[1].textContent.trim()));
    // Newest first: every status the sandbox went through, and nothing else.
    assert.deepEqual(rows, ['paused', 'running', 'provisioning', 'queued']);
    const history = await historyBox.innerText();
    assert.doesNotMatch(history, /requested|sandbox\.pause\b|sandbox\.admit|sandbox\.activate/);
    // The pause request is an audit action, listed (and named as one) under its own heading.
    const activity = page.locator('section[aria-labelledby="activity-h"]');
    await activity.locator('td', { hasText: 'sandbox.pause' }).waitFor();
    assert.match(await activity.innerText(), /requested/);
    await axeCheck(page, 'tenant-sandbox-history');
    await ok(await dev.call('DELETE', `/v1/sandboxes/${id}`, undefined, t.keyA), 'delete');
  });

  test('another organization\'s sandbox is not found, operator pages are refused', async () => {
    await page.goto(`/ui/#/sandbox/${t.sandboxB}`);
    await page.locator('.error', { hasText: 'not_found' }).waitFor();
    await page.goto('/ui/#/pools');
    await page.locator('.error', { hasText: 'operator' }).waitFor();
    await page.goto('/ui/#/audit');
    await page.locator('.error', { hasText: 'operator' }).waitFor();
    // And the API itself refuses the key, whatever the page shows.
    assert.equal((await dev.call('GET', '/v1/admin/queue', undefined, t.keyA)).status, 403);
    assert.equal((await dev.call('GET', `/v1/sandboxes/${t.sandboxB}`, undefined, t.keyA)).status, 404);
  });

  test('a project-bound key of the other org sees its own sandbox only, and no key management', async () => {
    const other = await newPage(browser, dev.url);
    await signIn(other, t.keyB);
    await other.locator(`tr[data-id="${t.sandboxB}"]`).waitFor();
    assert.equal(await other.locator(`tr[data-id="${t.sandboxA}"]`).count(), 0);
    assert.doesNotMatch(await other.locator('#nav').innerText(), /Keys/);
    await other.goto('/ui/#/keys');
    await other.locator('.error', { hasText: 'organization-wide key' }).waitFor();
    assert.deepEqual(other.problems, []);
    await other.context().close();
  });

  test('snapshots and quota pages', async () => {
    await page.goto('/ui/#/snapshots');
    await page.getByRole('heading', { name: 'Snapshots', level: 1 }).waitFor();
    await axeCheck(page, 'tenant-snapshots');
    await page.goto('/ui/#/quota');
    await page.getByRole('heading', { name: 'Organization' }).waitFor();
    await axeCheck(page, 'tenant-quota');
  });

  test('keys: create shows the secret once, revoke refuses it', async () => {
    await page.goto('/ui/#/keys');
    await page.getByLabel('Name').fill('ci-temp');
    await page.getByRole('button', { name: 'Create key' }).click();
    const secret = (await page.locator('#new-secret').innerText()).trim();
    assert.match(secret, /^dly_key_/);
    assert.equal((await dev.call('GET', '/v1/sandboxes', undefined, secret)).status, 200);
    // Its E2B alias (docs/e2b-facade.md) is the same key, accepted on the E2B surface.
    const alias = (await page.locator('#new-secret-e2b').innerText()).trim();
    assert.equal(alias, 'e2b_' + Buffer.from(secret).toString('hex'));
    assert.equal((await dev.call('GET', '/e2b/v2/sandboxes', undefined, alias)).status, 200);
    await axeCheck(page, 'tenant-keys');
    await page.getByRole('button', { name: 'Done, hide it' }).click();
    assert.equal(await page.locator('#new-secret').count(), 0);
    // Listed, never with its secret.
    assert.ok(!(await page.locator('main').innerText()).includes(secret));
    assert.ok(!(await page.locator('main').innerText()).includes(alias));
    const revoke = page.getByRole('button', { name: 'Revoke key ci-temp' });
    await revoke.click();
    await page.getByRole('button', { name: 'Confirm revoking key ci-temp' }).click();
    await page.locator('tr', { hasText: 'ci-temp' }).locator('.badge', { hasText: 'revoked' }).waitFor();
    assert.equal((await dev.call('GET', '/v1/sandboxes', undefined, secret)).status, 401);
    assert.deepEqual(page.problems, []);
  });
});

describe('operator', () => {
  let page;
  before(async () => { page = await newPage(browser, dev.url); });

  test('signs in with the admin key and sees every operator view', async () => {
    const put = await dev.call('PUT', '/v1/admin/secrets/ui-cred', { value: 's3cr3t-value-never-shown' });
    assert.equal(put.status, 200, JSON.stringify(put.body));
    // Signing in asks nothing the API refuses (the bootstrap key is not a stored key).
    const refused = [];
    page.on('response', (r) => { if (r.status() >= 400) refused.push(`${r.status()} ${r.request().method()} ${new URL(r.url()).pathname}`); });
    await signIn(page, dev.adminKey);
    await page.locator('#live-state', { hasText: 'live' }).waitFor();
    assert.deepEqual(refused, []);
    assert.match(await page.locator('#nav').innerText(), /Pools/);
    // With a second organization around (org B), the page still creates in the key's own
    // organization: the project offered is the bootstrap tenant's, and the create works.
    const offered = await page.locator('#c-project option').evaluateAll((os) => os.map((o) => o.value));
    assert.deepEqual(offered, [t.projectA]);
    await page.getByRole('button', { name: 'Create sandbox' }).click();
    await page.locator('.notice a[href^="#/sandbox/"]').or(page.locator('#main .error')).first().waitFor();
    assert.equal(await page.locator('#main .error').count(), 0, await page.locator('#main').innerText());
    const created = (await page.locator('.notice a').innerText()).trim();
    const row = await ok(await dev.call('GET', `/v1/sandboxes/${created}`), 'admin-created sandbox');
    assert.equal(row.orgId, t.orgA);
    assert.equal(row.projectId, t.projectA);
    assert.deepEqual(refused, []);
    const views = [
      ['pools', 'Pools'], ['queue', 'Fair queue'], ['policies', 'Placement policies'],
      ['audit', 'Audit log'], ['trust', 'Trust report'], ['secrets', 'Secrets'],
    ];
    for (const [name, heading] of views) {
      await page.goto(`/ui/#/${name}`);
      await page.getByRole('heading', { name: heading, level: 1 }).waitFor();
      if (name === 'pools') {
        await page.locator('#pool-strip li', { hasText: 'local' }).waitFor();
        // The card says what its number is: slots used, of how many (the dev pool has no cap).
        assert.match(await page.locator('#pool-strip li', { hasText: 'local' }).innerText(), /\b\d+ slots? used \(no limit\)/);
        assert.match(await page.locator('main').innerText(), /exec\.pty/);
      }
      if (name === 'secrets') {
        await page.locator('td', { hasText: 'ui-cred' }).waitFor();
        const text = await page.locator('main').innerText();
        assert.match(text, /sha256:/);
        assert.ok(!text.includes('s3cr3t-value-never-shown'), 'a secret value is on the page');
      }
      if (name === 'queue') {
        await page.getByText('Nobody is waiting.').or(page.locator('main table')).first().waitFor();
        // Two samples make the first chart.
        await page.locator('#chart-queue-depth svg').waitFor({ timeout: 15000 });
      }
      await axeCheck(page, `operator-${name}`);
    }
  });

  test('verifies the audit chain and exports it', async () => {
    await page.goto('/ui/#/audit');
    await page.getByRole('button', { name: 'Verify the chain' }).click();
    await page.locator('#verify-result', { hasText: 'The audit chain verifies.' }).waitFor();
    const [download] = await Promise.all([
      page.waitForEvent('download'),
      page.getByRole('button', { name: 'Export (JSON lines)' }).click(),
    ]);
    const path = await download.path();
    const { readFileSync } = await import('node:fs');
    const lines = readFileSync(path, 'utf8').trim().split('\n');
    assert.ok(lines.length > 3, `export has ${lines.length} lines`);
    JSON.parse(lines[0]);
    await axeCheck(page, 'operator-audit-verified');
  });

  test('the fair queue names who waits behind which wall', async () => {
    // Org B may run one sandbox; its second waits behind the org's quota.
    const put = await dev.call('PUT', `/v1/orgs/${t.orgB}/quota`, { maxActive: 1 });
    assert.ok(put.status < 300, `quota: ${put.status} ${JSON.stringify(put.body)}`);
    const waiting = await ok(await dev.call('POST', '/v1/sandboxes', {}, t.keyB), 'second sandbox B');
    await page.goto('/ui/#/queue');
    // The view re-reads the queue every 3 s; the wall is named once the placement leader
    // has stored the waiting explanation.
    const row = page.locator('tr', { hasText: 'other-org' }).filter({ hasText: 'org: 1' });
    await row.waitFor({ timeout: 15000 });
    assert.match(await row.innerText(), /waiting: org active quota 1\/1/);
    assert.match(await row.innerText(), new RegExp(waiting.id));
    await page.locator('#chart-queue-depth svg').waitFor({ timeout: 15000 });
    await page.locator('#chart-admission-and-activation-rate svg').waitFor({ timeout: 15000 });
    await axeCheck(page, 'operator-queue-waiting');
    assert.deepEqual(page.problems, []);
  });

  test('the pools page shows each pool\'s warm classes with ready, creating and size', async () => {
    const classes = [
      { name: 'default', size: 0, refillPerSecond: 1 },
      { name: 'py', size: 0, maxSize: 2, refillPerSecond: 0.5, template: 'python:3.12', resources: { cpu: 2, memoryMiB: 2048, diskGiB: 5 } },
    ];
    await ok(await dev.call('PUT', '/v1/admin/pools/local/warm', { classes }), 'warm classes');
    try {
      await page.goto('/ui/#/queue');
      await page.getByRole('heading', { name: 'Fair queue', level: 1 }).waitFor();
      await page.goto('/ui/#/pools');
      await page.getByRole('heading', { name: 'Warm classes', level: 2 }).waitFor();
      const rows = page.locator('#warm-classes tbody tr');
      await rows.nth(1).waitFor();
      assert.equal(await rows.count(), 2);
      const first = await rows.nth(0).innerText();
      assert.match(first, /local/);
      assert.match(first, /default/);
      assert.match(first, /0 ready/);
      assert.match(first, /0 creating/);
      assert.match(first, /pool default/);
      // Nothing matched either class yet.
      assert.match(first, /0\/min/);
      assert.match(first, /no creates/);
      const second = await rows.nth(1).innerText();
      assert.match(second, /py/);
      assert.match(second, /0 \(max 2\)/);
      assert.match(second, /python:3\.12/);
      assert.match(second, /2 CPU · 2048 MiB · 5 GiB/);
      await axeCheck(page, 'operator-pools-warm');
    } finally {
      await ok(await dev.call('PUT', '/v1/admin/pools/local/warm', { classes: [] }), 'clear warm classes');
    }
    await page.goto('/ui/#/queue');
    await page.getByRole('heading', { name: 'Fair queue', level: 1 }).waitFor();
    await page.goto('/ui/#/pools');
    await page.getByText('No warm classes.').waitFor();
    assert.deepEqual(page.problems, []);
  });

  test('the warm table shows claims per minute and the hit ratio of each class', async () => {
    // One instance, and none more for 100 s (a bucket holds one token at most): the first
    // matching create claims it, the second finds none and goes cold.
    const classes = [{ name: 'default', size: 1, refillPerSecond: 0.01 }];
    await ok(await dev.call('PUT', '/v1/admin/pools/local/warm', { classes }), 'warm classes');
    const made = [];
    try {
      const deadline = Date.now() + 60000;
      for (;;) {
        const doc = await ok(await dev.call('GET', '/v1/admin/pools/local/warm'), 'warm');
        if (doc.classes[0].ready === 1) break;
        assert.ok(Date.now() < deadline, `the class never had its instance: ${JSON.stringify(doc)}`);
        await new Promise((r) => setTimeout(r, 100));
      }
      for (const what of ['hit', 'miss']) {
        const created = await ok(await dev.call('POST', '/v1/sandboxes', { projectId: t.projectA }, t.keyA), what);
        made.push(created.id);
        assert.equal(created.status === 'running', what === 'hit', `${what}: ${JSON.stringify(created)}`);
      }
      // The API serves the counts (every process's, from the store).
      const doc = await ok(await dev.call('GET', '/v1/admin/pools/local/warm'), 'warm');
      assert.equal(doc.classes[0].hitRatio, 0.5, JSON.stringify(doc));
      assert.ok(doc.classes[0].claimsPerMinute > 0 && doc.classes[0].claimsPerMinute <= 1 / 9, JSON.stringify(doc));
      await page.goto('/ui/#/queue');
      await page.getByRole('heading', { name: 'Fair queue', level: 1 }).waitFor();
      await page.goto('/ui/#/pools');
      await page.getByRole('heading', { name: 'Warm classes', level: 2 }).waitFor();
      const row = page.locator('#warm-classes tbody tr').first();
      await row.waitFor();
      const text = await row.innerText();
      assert.match(text, /default/);
      assert.match(text, /50% hit/);
      assert.match(text, /0\.1\/min/);
      const headers = await page.locator('#warm-classes thead').innerText();
      assert.match(headers, /Claims\/min/);
      assert.match(headers, /Hit ratio/);
      await axeCheck(page, 'operator-pools-warm-claims');
    } finally {
      for (const id of made) {
        await ok(await dev.call('DELETE', `/v1/sandboxes/${id}`, undefined, t.keyA), 'delete');
      }
      await ok(await dev.call('PUT', '/v1/admin/pools/local/warm', { classes: [] }), 'clear warm classes');
    }
    assert.deepEqual(page.problems, []);
  });

  test('without metrics in the answering process, the rate chart says why and what to set', async () => {
    // As an API process of the production topology answers without `[metrics] listen`.
    const summary = (url) => url.pathname === '/v1/admin/metrics/summary';
    await page.route(summary, (route) => route.fulfill({
      json: { generatedAt: new Date().toISOString(), enabled: false, admissions: {}, activations: {}, queueDepth: {} },
    }));
    // Another view first: the queue view is rendered anew (and asks the route) on arrival.
    await page.goto('/ui/#/pools');
    await page.getByRole('heading', { name: 'Pools', level: 1 }).waitFor();
    await page.goto('/ui/#/queue');
    const fig = page.locator('#chart-admission-and-activation-rate');
    await fig.waitFor();
    assert.match(await fig.innerText(), /\[metrics\] listen/);
    // The queue depth still charts: it comes from the store.
    await page.locator('#chart-queue-depth svg').waitFor({ timeout: 15000 });
    await axeCheck(page, 'operator-queue-no-metrics');
    await page.unroute(summary);
    assert.deepEqual(page.problems, []);
  });
});
