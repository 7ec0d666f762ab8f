/**
 * The service page's "Try a prediction" body, shaped as the model takes it: from the service's input schema (its
 * predictor's `input_schema`: one instance's shape and dtype), else from the MLflow signature of a version
 * registered `--from-run` (one tensor spec, or named columns), else a body that says what to put. Pure: run by
 * Node.js in tests/e2e/test_predict_example.py.
 */

export type InputSchema = { shape?: (number | null)[]; dtype?: string } | null | undefined;
type Json = number | string | boolean | null | Json[] | { [key: string]: Json };
type Spec = { type?: string; name?: string; "tensor-spec"?: { dtype?: string; shape?: number[] } };

const MAX_VALUES = 4096; // a body of more zeros than this says how many instead of spelling them out

function filled(shape: (number | null)[], value: Json): Json {
  if (!shape.length) return value;
  const [first, ...rest] = shape;
  const n = first === null || first === undefined || first < 1 ? 1 : first;
  return Array.from({ length: n }, () => filled(rest, value));
}

function zero(dtype: string | undefined): Json {
  if (!dtype) return 0.0;
  if (dtype === "string" || dtype === "str" || dtype === "binary") return "text";
  if (dtype === "boolean" || dtype === "bool") return false;
  return 0;
}

function count(shape: (number | null)[]): number {
  return shape.reduce<number>((n, d) => n * (d && d > 0 ? d : 1), 1);
}

function body(instance: Json): string {
  return JSON.stringify({ inputs: [instance] });
}

/** One instance from the predictor's input schema; undefined where it has none or one too big to spell out. */
export function fromInputSchema(schema: InputSchema): Json | undefined {
  if (!schema) return undefined;
  const shape = schema.shape ?? [];
  if (count(shape) > MAX_VALUES) return undefined;
  return filled(shape, zero(schema.dtype));
}

/** One instance from an MLflow signature's inputs (a JSON string, as the MLmodel file holds it, or parsed). */
export function fromSignature(signature: Record<string, unknown> | null | undefined): Json | undefined {
  const raw = signature?.inputs;
  let inputs: unknown = raw;
  if (typeof raw === "string") {
    try {
      inputs = JSON.parse(raw);
    } catch {
      return undefined;
    }
  }
  if (!Array.isArray(inputs) || !inputs.length) return undefined;
  const specs = inputs as Spec[];
  if (specs.length === 1 && specs[0].type === "tensor") {
    const tensor = specs[0]["tensor-spec"] ?? {};
    const shape = (tensor.shape ?? []).slice(1).map((d) => (d > 0 ? d : null)); // without the batch dimension
    if (count(shape) > MAX_VALUES) return undefined;
    return filled(shape, zero(tensor.dtype));
  }
  if (specs.every((s) => typeof s.name === "string" && s.name)) {
    return Object.fromEntries(specs.map((s) => [s.name as string, zero(s.type)]));
  }
  return undefined;
}

/** The body the form starts with. */
export function exampleBody(schema: InputSchema, signature?: Record<string, unknown> | null): string {
  const instance = fromInputSchema(schema) ?? fromSignature(signature);
  if (instance !== undefined) return body(instance);
  return '{\n  "inputs": [[0.0, 1.0, 2.0, 3.0]]\n}';
}
