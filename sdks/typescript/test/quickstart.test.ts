/**
 * Runs the quickstart of docs/sdk-typescript.md as written (extracted and type-checked by
 * `npm run build:test`) against a real `differently dev`, so the doc cannot drift.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, before, it } from "node:test";
import { REPO_ROOT, startDev, type DevServer } from "./fixture.js";

let dev: DevServer;
before(async () => {
  dev = await startDev();
});
after(async () => {
  await dev?.stop();
});

it("the quickstart in docs/sdk-typescript.md runs and prints what it says", async () => {
  const script = join(REPO_ROOT, "sdks/typescript/dist-test/quickstart-build/quickstart.js");
  assert.ok(existsSync(script), `${script} missing: run npm run build:test`);
  const out = await new Promise<string>((ok, fail) =>
    execFile(
      process.execPath,
      [script],
      { env: { ...process.env, DIFFERENTLY_URL: dev.url, DIFFERENTLY_API_KEY: dev.apiKey }, timeout: 60_000 },
      (err, stdout, stderr) => (err ? fail(new Error(`quickstart failed: ${err.message}\n${stdout}\n${stderr}`)) : ok(stdout)),
    ),
  );
  const lines = out.trimEnd().split("\n");
  assert.match(lines[0]!, /^sandbox sbx_\w+ is running on local$/);
  assert.deepEqual(lines.slice(1, 5), ["[stdout] line 1", "[stdout] line 2", "[stdout] line 3", "exit code 3"]);
  assert.ok(lines.includes("hello from the SDK"));
  assert.ok(lines.includes("/work/hello.txt 19"));
  assert.ok(lines.some((l) => /^event \d+: running$/.test(l)));
  assert.ok(lines.some((l) => /^event \d+: terminated$/.test(l)));
  assert.equal(lines.at(-1), "422 validation_failed resources.cpu", out);
});
