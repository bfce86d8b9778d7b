// The dashboard's page logic that needs no browser: which state of a sandbox a live page
// shows when records and events arrive in any order, the list's order, a pool's slots in
// words, and which audit records are status changes. The modules are the served files
// themselves (api/ui/js), imported as they are.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { LiveSandboxes, listOrder } from '../../api/ui/js/live.js';
import { slotsText } from '../../api/ui/js/operator.js';
import { statusChange } from '../../api/ui/js/sandbox.js';

const ID = 'sbx_01JD0000000000000000000001';
const rec = (status, extra = {}) => ({ id: ID, status, statusReason: null, pool: 'local', labels: { a: '1' }, ...extra });
const ev = (status, statusVersion) => ({ sandboxId: ID, status, statusReason: null, pool: 'local', statusVersion });

describe('LiveSandboxes', () => {
  test('a create answered after the stream said running keeps running', () => {
    const live = new LiveSandboxes();
    const beforePost = live.mark();
    assert.ok(live.event(ev('provisioning', 2)));
    assert.ok(live.event(ev('running', 3)));
    // The event alone makes no row; the page reads the sandbox, which is running by then.
    const beforeGet = live.mark();
    live.record(rec('running'), beforeGet);
    // Then the create's answer arrives, read before either change.
    live.record(rec('provisioning'), beforePost);
    assert.equal(live.view(ID).status, 'running');
  });

  test('an event during a read that answers the older state is not lost', () => {
    const live = new LiveSandboxes();
    live.record(rec('queued'), live.mark());
    live.event(ev('provisioning', 2));
    const beforeGet = live.mark();
    // The read is slow; meanwhile the sandbox runs and the stream says so.
    live.event(ev('running', 3));
    live.record(rec('provisioning'), beforeGet);
    assert.equal(live.view(ID).status, 'running');
    // The record's other fields still show.
    assert.deepEqual(live.view(ID).labels, { a: '1' });
  });

  test('a late, older event is dropped by statusVersion', () => {
    const live = new LiveSandboxes();
    live.record(rec('provisioning'), live.mark());
    assert.ok(live.event(ev('running', 3)));
    assert.equal(live.event(ev('provisioning', 2)), false);
    assert.equal(live.event(ev('running', 3)), false, 'a re-delivery');
    assert.equal(live.view(ID).status, 'running');
  });

  test('a record read after an event is the truth, and a later event overrides it', () => {
    const live = new LiveSandboxes();
    live.event(ev('running', 3));
    live.record(rec('paused'), live.mark());
    assert.equal(live.view(ID).status, 'paused');
    live.event(ev('running', 5));
    assert.equal(live.view(ID).status, 'running');
  });

  test('an older answer that overtook a newer one does not replace it', () => {
    const live = new LiveSandboxes();
    const first = live.mark();
    const second = live.mark();
    assert.ok(live.record(rec('running'), second));
    assert.equal(live.record(rec('provisioning'), first), false);
    assert.equal(live.view(ID).status, 'running');
  });

  test('an event for a sandbox with no record makes no row until it is read', () => {
    const live = new LiveSandboxes();
    assert.ok(live.event(ev('running', 3)));
    assert.equal(live.has(ID), false);
    assert.equal(live.view(ID), null);
  });
});

test('the list: live sandboxes first, newest first, ended ones after', () => {
  const rows = [
    { id: 'sbx_01A', status: 'running' },
    { id: 'sbx_01B', status: 'terminated' },
    { id: 'sbx_01C', status: 'provisioning' },
    { id: 'sbx_01D', status: 'failed' },
    { id: 'sbx_01E', status: 'paused' },
  ];
  assert.deepEqual(rows.sort(listOrder).map((r) => r.id), ['sbx_01E', 'sbx_01C', 'sbx_01A', 'sbx_01D', 'sbx_01B']);
});

test('a pool card says how many slots are used of how many', () => {
  assert.equal(slotsText({ usedSlots: 3, maxConcurrent: 10 }), '3 of 10 slots used');
  assert.equal(slotsText({ usedSlots: 1, maxConcurrent: null }), '1 slot used (no limit)');
  assert.equal(slotsText({ maxConcurrent: 4 }), '0 of 4 slots used');
});

test('status history: status changes only', () => {
  const r = (action, outcome, detail) => ({ action, outcome, detail });
  assert.deepEqual(statusChange(r('sandbox.admit', 'ok', { projectId: 'prj_1' })), { to: 'queued', from: null, reason: null });
  assert.deepEqual(statusChange(r('sandbox.activate', 'ok', { pool: 'local' })), { to: 'provisioning', from: null, reason: null });
  assert.deepEqual(statusChange(r('sandbox.running', 'ok', { pool: 'local' })), { to: 'running', from: null, reason: null });
  assert.deepEqual(statusChange(r('sandbox.terminating', 'ok', { from: 'paused', to: 'terminating', reason: 'deleted' })),
    { to: 'terminating', from: 'paused', reason: 'deleted' });
  for (const other of [r('sandbox.pause', 'requested', {}), r('file.upload', 'ok', { path: '/x' }),
    r('sandbox.pty', 'ok', {}), r('sandbox.exec', 'exit:0', {}), r('sandbox.renew', 'ok', {})]) {
    assert.equal(statusChange(other), null, other.action);
  }
});
