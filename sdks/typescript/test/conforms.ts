/**
 * Whether a real answer holds to the served schema and to the SDK's manifest for `model`:
 * every field the schema requires is there, nothing is there that the SDK model lacks, and each
 * value has the SDK's type (null only where the SDK allows it).
 */
import assert from "node:assert/strict";
import { MODELS } from "@differently/sdk";

type Json = Record<string, any>;

function resolve(doc: Json, node: Json): Json {
  if (node && typeof node.$ref === "string") return doc.components.schemas[node.$ref.replace("#/components/schemas/", "")];
  return node;
}

/** Checks `obj` against `fields` (SDK specs) and the schema node's `required`. */
export function conformsToFields(what: string, fields: Record<string, string>, required: readonly string[], obj: unknown): void {
  const shown = JSON.stringify(obj).slice(0, 300);
  assert.ok(obj && typeof obj === "object" && !Array.isArray(obj), `${what}: not an object: ${shown}`);
  const o = obj as Json;
  for (const f of required) assert.ok(f in o, `${what}.${f} required, missing in ${shown}`);
  for (const [k, v] of Object.entries(o)) {
    const want = fields[k];
    assert.ok(want, `${what}: the answer has ${k}, the SDK model does not (${shown})`);
    if (want === "any") continue;
    const nullable = want.endsWith("?");
    const base = nullable ? want.slice(0, -1) : want;
    const got = v === null ? "null" : Array.isArray(v) ? "array" : Number.isInteger(v) ? "integer" : typeof v;
    const ok = got === "null" ? nullable : got === base || (base === "number" && got === "integer");
    assert.ok(ok, `${what}.${k}: answer has ${got}, SDK says ${want}`);
  }
}

/** The schema one step (`items` or a property) below `node`; an optional object (`anyOf` of it
 * and null) is looked into, as a model nested in one sits there. */
export function descend(doc: Json, node: Json | undefined, step: string): Json | undefined {
  if (!node) return undefined;
  node = resolve(doc, node);
  const next = step === "items" && node.items ? node.items : node.properties?.[step];
  if (!next) return undefined;
  const alts: Json[] = next.anyOf ?? next.oneOf ?? [];
  return alts.find((a) => a.type !== "null") ?? next;
}

/** The schema a manifest entry describes: its component, then its `at` steps. */
export function schemaOf(doc: Json, spec: { schema: string; at?: string }): Json | undefined {
  let node: Json | undefined = doc.components?.schemas?.[spec.schema];
  for (const step of spec.at ? spec.at.split(".") : []) node = descend(doc, node, step);
  return node && resolve(doc, node);
}

export function conforms(doc: Json, model: string, obj: unknown): void {
  const spec = MODELS[model];
  assert.ok(spec, `no SDK manifest for ${model}`);
  const node = schemaOf(doc, spec);
  assert.ok(node, `${model}: no schema at ${spec.schema} ${spec.at ?? ""}`);
  conformsToFields(model, spec.fields, node.required ?? [], obj);
}
