// Extracts the quickstart from docs/sdk-typescript.md (the ```ts block after the
// `<!-- quickstart: tested by sdks/typescript/test/quickstart.test.ts -->` marker) into
// quickstart-build/quickstart.ts, so tsc type-checks it and the test runs it: the doc cannot drift.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const doc = join(here, "../../../docs/sdk-typescript.md");
const text = readFileSync(doc, "utf8");
const marker = "<!-- quickstart: tested by sdks/typescript/test/quickstart.test.ts -->";
const at = text.indexOf(marker);
if (at === -1) throw new Error(`${doc}: no quickstart marker`);
const m = /```ts\n([\s\S]*?)\n```/.exec(text.slice(at));
if (!m) throw new Error(`${doc}: no \`\`\`ts block after the quickstart marker`);
const out = join(here, "../quickstart-build");
mkdirSync(out, { recursive: true });
writeFileSync(join(out, "quickstart.ts"), `${m[1]}\nexport {};\n`);
console.log(`extracted the quickstart (${m[1].split("\n").length} lines) from docs/sdk-typescript.md`);
