/**
 * Starts a real `differently dev` (devhost pool: real processes on this host) on a free
 * loopback port with a temporary key file and sandbox root, and stops it afterwards.
 *
 * The binary: DIFFERENTLY_BIN, else the workspace's target/debug/differently. Missing → the
 * test fails saying how to build it (never skipped).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Differently } from "@differently/sdk";

/** sdks/typescript/dist-test/test → the repository root. */
export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

export function differentlyBin(): string {
  const bin = process.env["DIFFERENTLY_BIN"] || join(REPO_ROOT, "target/debug/differently");
  if (!existsSync(bin)) {
    throw new Error(
      `the differently binary is missing at ${bin}: run \`cargo build -p differently\` in ${REPO_ROOT} ` +
        `(or set DIFFERENTLY_BIN to a built binary)`,
    );
  }
  return bin;
}

export interface DevServer {
  url: string;
  /** The admin key (bootstrap key) of this run. */
  apiKey: string;
  auditKey: string;
  dir: string;
  child: ChildProcess;
  client(extra?: { timeoutMs?: number; maxRetries?: number; fetch?: typeof fetch }): Differently;
  stop(): Promise<void>;
  /** stderr so far (for failure messages). */
  log(): string;
}

export interface DevOptions {
  /** Extra environment for the binary (e.g. `DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE`). */
  env?: Record<string, string>;
}

export async function startDev(opts: DevOptions = {}): Promise<DevServer> {
  const bin = differentlyBin();
  const dir = mkdtempSync(join(tmpdir(), "differently-sdk-ts-"));
  const child = spawn(bin, ["dev", "--listen", "127.0.0.1:0", "--key-file", join(dir, "key"), "--root", join(dir, "root")], {
    stdio: ["ignore", "pipe", "pipe"],
    // A secrets key so stored secrets (admin) work; the audit key is dev's own, printed below.
    env: {
      ...process.env,
      RUST_LOG: process.env["RUST_LOG"] ?? "warn",
      NO_COLOR: "1",
      DIFFERENTLY_SECRETS_KEY: randomBytes(32).toString("hex"),
      ...(opts.env ?? {}),
    },
  });
  let out = "";
  let err = "";
  child.stderr!.setEncoding("utf8").on("data", (d: string) => {
    err += d;
    if (err.length > 200_000) err = err.slice(-100_000);
  });
  const vars = await new Promise<Record<string, string>>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`differently dev did not print its URL within 30 s; stderr:\n${err}`)), 30_000);
    child.on("exit", (code) => {
      clearTimeout(timer);
      fail(new Error(`differently dev exited early (${code}); stderr:\n${err}`));
    });
    child.stdout!.setEncoding("utf8").on("data", (d: string) => {
      out += d;
      const v: Record<string, string> = {};
      for (const m of out.matchAll(/^export (\w+)=(\S+)$/gm)) v[m[1]!] = m[2]!;
      if (v["DIFFERENTLY_URL"] && v["DIFFERENTLY_API_KEY"] && v["DIFFERENTLY_AUDIT_KEY"]) {
        clearTimeout(timer);
        ok(v);
      }
    });
  });
  const url = vars["DIFFERENTLY_URL"]!;
  const apiKey = vars["DIFFERENTLY_API_KEY"]!;
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      const r = await fetch(`${url}/readyz`);
      if (r.ok) break;
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) throw new Error(`differently dev at ${url} never became ready; stderr:\n${err}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  let stopped = false;
  return {
    url,
    apiKey,
    auditKey: vars["DIFFERENTLY_AUDIT_KEY"]!,
    dir,
    child,
    client: (extra = {}) => new Differently({ baseUrl: url, apiKey, ...extra }),
    log: () => err,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        const t = setTimeout(() => child.kill("SIGKILL"), 10_000);
        await exited;
        clearTimeout(t);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A fresh sandbox, running. */
export async function runningSandbox(c: Differently, req: Parameters<Differently["sandboxes"]["create"]>[0] = {}) {
  const s = await c.sandboxes.create(req);
  return c.sandboxes.wait(s.id, { status: "running", timeoutMs: 30_000 });
}

/**
 * Reads messages until `until` holds for one (inclusive; `got` is every message read so far),
 * within `ms`; a timeout or the stream's end fails, listing each message read by `label`.
 */
export async function readUntil<M extends { id: number; type: string }>(
  it: AsyncIterator<M>,
  until: (m: M, got: M[]) => boolean,
  { ms = 20_000, label = (m: M): unknown => [m.id, m.type] }: { ms?: number; label?: (m: M) => unknown } = {},
): Promise<M[]> {
  const got: M[] = [];
  const deadline = Date.now() + ms;
  const seen = () => JSON.stringify(got.map(label));
  for (;;) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`no matching event within ${ms} ms; got ${seen()}`);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const r = await Promise.race([
      it.next(),
      new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`timed out after ${ms} ms; got ${seen()}`)), left))),
    ]).finally(() => clearTimeout(timer));
    if (r.done) throw new Error("event stream ended");
    got.push(r.value);
    if (until(r.value, got)) return got;
  }
}
