/**
 * A loopback TCP forwarder the tests can cut: `drop()` destroys every open connection and
 * `refuse(true)` closes new ones at once, to make an SDK's connection break for real.
 * It forwards only to 127.0.0.1 (refused in code otherwise) and listens only on 127.0.0.1.
 */
import { createServer, connect, type Socket, type AddressInfo } from "node:net";

export interface Proxy {
  url: string;
  drop(): void;
  refuse(on: boolean): void;
  /** The request heads (method line and headers) seen so far, lower-cased. */
  heads: string[];
  close(): Promise<void>;
}

export async function startProxy(target: string): Promise<Proxy> {
  const t = new URL(target);
  if (t.hostname !== "127.0.0.1") throw new Error(`the test proxy forwards to 127.0.0.1 only, not ${t.hostname}`);
  const port = Number(t.port);
  const open = new Set<Socket>();
  const heads: string[] = [];
  let refusing = false;
  const server = createServer((client) => {
    if (refusing) {
      client.destroy();
      return;
    }
    const upstream = connect(port, "127.0.0.1");
    open.add(client);
    open.add(upstream);
    let first = true;
    client.on("data", (d: Buffer) => {
      if (first) {
        first = false;
        heads.push(d.toString("latin1").split("\r\n\r\n")[0]!.toLowerCase());
      }
    });
    client.pipe(upstream).pipe(client);
    const end = () => {
      client.destroy();
      upstream.destroy();
      open.delete(client);
      open.delete(upstream);
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const addr = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${addr.port}`,
    heads,
    drop: () => {
      for (const s of open) s.destroy();
      open.clear();
    },
    refuse: (on) => {
      refusing = on;
    },
    close: () =>
      new Promise<void>((r) => {
        for (const s of open) s.destroy();
        server.close(() => r());
      }),
  };
}
