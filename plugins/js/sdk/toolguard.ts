// toolguard's helper module for TypeScript tools. The contract's own types
// (`toolguard:plugin/*`) are generated from `wit/` by jco's type generator
// (see gen-types.mjs); this module adds the little a tool needs on top:
//
//   - `defineTool`: a tool is a function with a JSON Schema object for its
//     arguments (and result), and the effect class it claims;
//   - `toolExport` / `reconcilerExport`: the component's `tool` and
//     `reconciler` exports from a list of tools;
//   - `send` / `fetch` and request builders: the only way out, through the
//     host's guard (the host mints the idempotency key; a tool never sees it
//     when sending).

import { config as hostConfig, fetch as hostFetch, send as hostSend } from "toolguard:plugin/outbound@0.1.0";
import type {
  Attempt,
  Effect,
  OutboundError,
  Reconciliation,
  Request,
  Response,
  ToolError,
  ToolSpec,
} from "toolguard:plugin/types@0.1.0";

export type { Attempt, Effect, OutboundError, Reconciliation, Request, Response, ToolError };

/** A JSON Schema (draft 2020-12) as a plain object. */
export type JsonSchema = { [keyword: string]: unknown };

/** One tool: a function on its arguments, the schema they match, and the effect it claims. */
export interface ToolDefinition<A, R> {
  /** Unique across the host: 1–64 of `A-Z a-z 0-9 _ -`. */
  name: string;
  /** What the tool does, written for the model. */
  description: string;
  /** The effect class claimed; the reviewer's policy has the last word. */
  effect: Effect;
  /** The schema of the arguments object; the host validates every call against it. */
  input: JsonSchema;
  /** The schema of the result object, if the tool promises one. */
  output?: JsonSchema;
  /** Runs the tool. Throw `failed(...)` or let a guard error propagate. */
  run(args: A): R;
  /** Looks an attempt whose outcome is unknown up at the provider (`fetch` only). */
  reconcile?(args: A, attempt: Attempt): Reconciliation;
}

/** Declares a tool; the identity function, there for the types. */
export function defineTool<A, R>(tool: ToolDefinition<A, R>): ToolDefinition<A, R> {
  return tool;
}

// Tools of any argument and result types, as the exports hold them.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyTool = ToolDefinition<any, unknown>;

/** The component's `tool` export for `tools`. */
export function toolExport(tools: AnyTool[]) {
  return {
    describe(): ToolSpec[] {
      return tools.map((t) => ({
        name: t.name,
        description: t.description,
        inputSchema: JSON.stringify(t.input),
        outputSchema: t.output === undefined ? undefined : JSON.stringify(t.output),
        effect: t.effect,
      }));
    },
    invoke(toolName: string, argsJson: string): string {
      const tool = tools.find((t) => t.name === toolName);
      if (tool === undefined) {
        throw { tag: "invalid-args", val: `unknown tool ${toolName}` } satisfies ToolError;
      }
      return JSON.stringify(tool.run(JSON.parse(argsJson)));
    },
  };
}

/** The component's `reconciler` export (world `reconciling-plugin`) for `tools`. */
export function reconcilerExport(tools: AnyTool[]) {
  return {
    reconcile(toolName: string, argsJson: string, attempt: Attempt): Reconciliation {
      const tool = tools.find((t) => t.name === toolName);
      if (tool?.reconcile === undefined) {
        return { tag: "still-unknown", val: `${toolName} has no reconciler` };
      }
      try {
        return tool.reconcile(JSON.parse(argsJson), attempt);
      } catch (e) {
        return { tag: "still-unknown", val: `the look-up failed: ${JSON.stringify(e)}` };
      }
    },
  };
}

/** Stops the tool with a failure the model reads (e.g. the provider declined). */
export function failed(message: string): never {
  throw { tag: "failed", val: message } satisfies ToolError;
}

/** A non-secret setting from the host config for this plugin, if set. Secrets never reach a plugin. */
export function config(name: string): string | undefined {
  return hostConfig(name);
}

/** A setting the tool cannot work without; a clear failure if it is missing. */
export function requiredConfig(name: string): string {
  return config(name) ?? failed(`the plugin setting \`${name}\` is not configured`);
}

// componentize-js throws an import's error result as a ComponentError whose
// `payload` is the error value; a tool passes it on unchanged as `outbound`.
function guarded(call: (req: Request) => Response, req: Request): Response {
  try {
    return call(req);
  } catch (e) {
    const error = ((e as { payload?: OutboundError }).payload ?? e) as OutboundError;
    throw { tag: "outbound", val: error } satisfies ToolError;
  }
}

/**
 * Sends `req` under the guard: checked against the grants, keyed and recorded
 * by the host before it leaves; a repeat returns the recorded response. A
 * host error is thrown as the tool error `{ tag: "outbound", val }`.
 */
export function send(req: Request): Response {
  return guarded(hostSend, req);
}

/** Fetches `req` (`GET`/`HEAD`): inside the grants, not keyed, not recorded. */
export function fetch(req: Request): Response {
  return guarded(hostFetch, req);
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A request with a JSON body. */
export function jsonRequest(method: string, url: string, body: unknown): Request {
  return {
    method,
    url,
    headers: [{ name: "content-type", value: "application/json" }],
    body: encoder.encode(JSON.stringify(body)),
  };
}

/** A request with a form-encoded body, as Stripe-like APIs take. */
export function formRequest(method: string, url: string, fields: Record<string, string>): Request {
  return {
    method,
    url,
    headers: [{ name: "content-type", value: "application/x-www-form-urlencoded" }],
    body: encoder.encode(new URLSearchParams(fields).toString()),
  };
}

/** A GET of `url` with `query` form-encoded onto it. */
export function getRequest(url: string, query: Record<string, string> = {}): Request {
  const q = new URLSearchParams(query).toString();
  return { method: "GET", url: q === "" ? url : `${url}${url.includes("?") ? "&" : "?"}${q}`, headers: [], body: new Uint8Array() };
}

/** Whether the status is 2xx. */
export function ok(res: Response): boolean {
  return res.status >= 200 && res.status < 300;
}

/** The body as text. */
export function text(res: Response): string {
  return decoder.decode(res.body);
}

/** The body parsed as JSON; a body that is not is a failure that says so. */
export function json<T>(res: Response): T {
  try {
    return JSON.parse(text(res)) as T;
  } catch {
    return failed(`the downstream answered HTTP ${res.status} with a body that is not JSON`);
  }
}

/** The provider has the attempt: `body` is what the request would have returned. */
export function found(body: unknown, status = 200): Reconciliation {
  return {
    tag: "found",
    val: { status, headers: [{ name: "content-type", value: "application/json" }], body: encoder.encode(JSON.stringify(body)) },
  };
}
