/**
 * Runs the quickstart of docs/sdk-typescript.md the way the page tells a user to: the block
 * saved as `quickstart.mts` in an app of its own (the SDK installed as `npm install <path>`
 * installs it, a link in node_modules), compiled with the page's `tsc` command, and the
 * output run with `node`, against a real `differently dev`. The doc cannot drift from the SDK
 * nor from how it says to run its examples.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, it } from "node:test";
import { REPO_ROOT, startDev, type DevServer } from "./fixture.js";

/** The page's command, word for word (asserted below); `npx tsc` is the app's own tsc. */
const RUN = "npx tsc --module nodenext --target es2022 --strict quickstart.mts && node quickstart.mjs";
const MARKER = "<!-- quickstart: tested by sdks/typescript/test/quickstart.test.ts -->";

let dev: DevServer;
let app: string | undefined;
before(async () => {
  dev = await startDev();
});
after(async () => {
  await dev?.stop();
  if (app) rmSync(app, { recursive: true, force: true });
});

/** Runs `argv` in `cwd`; its stdout, or a failure with everything it printed. */
function run(argv: string[], cwd: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  return new Promise<string>((ok, fail) =>
    execFile(process.execPath, argv, { cwd, env, timeout: 120_000 }, (err, stdout, stderr) =>
      err ? fail(new Error(`${argv.join(" ")} failed: ${err.message}\n${stdout}\n${stderr}`)) : ok(stdout),
    ),
  );
}

it("the quickstart in docs/sdk-typescript.md runs as the page says and prints what it says", async () => {
  const doc = readFileSync(join(REPO_ROOT, "docs/sdk-typescript.md"), "utf8");
  const at = doc.indexOf(MARKER);
  assert.ok(at !== -1, "docs/sdk-typescript.md has no quickstart marker");
  const block = /```ts\n([\s\S]*?)\n```/.exec(doc.slice(at));
  assert.ok(block, "no ```ts block after the quickstart marker");
  assert.ok(doc.includes(RUN), `docs/sdk-typescript.md no longer says to run it with: ${RUN}`);

  // An app of its own, outside the SDK (no package.json "type": the .mts makes it a module).
  const sdk = join(REPO_ROOT, "sdks/typescript");
  const tsc = join(sdk, "node_modules/typescript/bin/tsc");
  assert.ok(existsSync(join(sdk, "dist/index.js")), "the SDK is not built: npm run build");
  assert.ok(existsSync(tsc), "typescript is not installed: npm ci");
  app = mkdtempSync(join(tmpdir(), "differently-sdk-ts-app-"));
  mkdirSync(join(app, "node_modules/@differently"), { recursive: true });
  symlinkSync(sdk, join(app, "node_modules/@differently/sdk"), "dir");
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "quickstart-app", private: true }));
  writeFileSync(join(app, "quickstart.mts"), `${block[1]}\n`);

  // `npx tsc …` is the app's typescript; here the SDK's pinned one, the same flags.
  const flags = RUN.split(" && ")[0]!.split(" ").slice(2);
  await run([tsc, ...flags], app);
  const out = await run([join(app, "quickstart.mjs")], app, {
    ...process.env,
    DIFFERENTLY_URL: dev.url,
    DIFFERENTLY_API_KEY: dev.apiKey,
  });
  const lines = out.trimEnd().split("\n");
  assert.match(lines[0]!, /^sandbox sbx_\w+ is running on local$/);
  assert.deepEqual(lines.slice(1, 5), ["[stdout] line 1", "[stdout] line 2", "[stdout] line 3", "exit code 3"]);
  assert.ok(lines.includes("hello from the SDK"));
  assert.ok(lines.includes("/work/hello.txt 19"));
  assert.ok(lines.some((l) => /^event \d+: running$/.test(l)));
  assert.ok(lines.some((l) => /^event \d+: terminated$/.test(l)));
  assert.equal(lines.at(-1), "422 validation_failed resources.cpu", out);
});
