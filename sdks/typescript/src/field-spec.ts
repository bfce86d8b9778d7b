/**
 * How a model's fields are written as data (`"string"`, `"integer?"` …, `?` = may be null), and
 * the helper that makes the compiler hold such a list to the model's TypeScript type: every
 * field present, none extra, each spec matching the field's type. So the chain is: TS type ⇔
 * manifest (tsc) ⇔ `/v1/openapi.json` (test).
 */

type Base<T> = [T] extends [string]
  ? "string"
  : [T] extends [number]
    ? "number"
    : [T] extends [boolean]
      ? "boolean"
      : [T] extends [readonly unknown[]]
        ? "array"
        : "object";
/** `unknown` → `any`; nullable → `<base>?`. Numbers may be `integer` or `number` on the wire. */
type Spec<T> = unknown extends T
  ? "any"
  : null extends T
    ? `${Widen<Base<Exclude<T, null | undefined>>>}?`
    : Widen<Base<Exclude<T, undefined>>>;
type Widen<B extends string> = B extends "number" ? "integer" | "number" : B;

export type Fields<T> = { [K in keyof T]-?: Spec<T[K]> };

/** `fields<T>()({...})`: the specs of `T`'s fields, checked against `T` by the compiler. */
export function fields<T>() {
  return <F extends Fields<T>>(f: F & Record<Exclude<keyof F, keyof T>, never>) => f;
}

/** SDK type name → (OpenAPI schema name, field specs, enums the SDK spells out). */
export interface ModelSpec {
  schema: string;
  /** Where the object sits inside the schema (e.g. `items.items` of FileList). */
  at?: string;
  fields: Record<string, string>;
  /** Request bodies: the SDK writes these; every field must exist, nothing else checked. */
  request?: boolean;
  enums?: Record<string, readonly string[]>;
}
