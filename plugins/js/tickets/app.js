// Support tickets in JavaScript: a guarded tool against a ticket desk that
// ignores idempotency keys (as most ticket, e-mail and chat APIs do). Built
// with plain `componentize-js` (no -d flags), world `reconciling-plugin`.
//
// - `create_ticket` (irreversible): POST /v1/tickets through outbound.send.
//   The host puts its key in the JSON body's `external_ref` (the downstream's
//   `json-field` key transport) and, since the desk does not deduplicate
//   (`honours_keys = false`), never re-sends blindly: a repeat replays the
//   recorded ticket, and an unknown outcome is reconciled below.
// - `reconcile`: searches the desk for the ticket carrying the attempt's key.

import { config, fetch as guardedFetch, send } from "toolguard:plugin/outbound@0.1.0";

const decoder = new TextDecoder();
const encoder = new TextEncoder();

function base() {
  const url = config("api_base");
  if (url === undefined) {
    throw { tag: "failed", val: "the plugin setting `api_base` is not configured" };
  }
  return url.replace(/\/+$/, "");
}

// Calls a host import, turning its error result into this tool's error.
function guarded(call, request) {
  try {
    return call(request);
  } catch (e) {
    // componentize-js throws a result's error as { payload } (ComponentError).
    throw { tag: "outbound", val: e.payload ?? e };
  }
}

export const tool = {
  describe() {
    return [{
      name: "create_ticket",
      description: "Opens a support ticket. Irreversible: every successful call opens a new ticket. " +
        "If the outcome is reported unknown, do not call it again: the host checks the desk first.",
      inputSchema: JSON.stringify({
        type: "object",
        properties: { subject: { type: "string", minLength: 1, maxLength: 200 }, body: { type: "string", maxLength: 10000 } },
        required: ["subject", "body"],
        additionalProperties: false,
      }),
      outputSchema: JSON.stringify({
        type: "object",
        properties: { ticket_id: { type: "string" }, subject: { type: "string" } },
        required: ["ticket_id", "subject"],
      }),
      effect: "irreversible",
    }];
  },
  invoke(toolName, argsJson) {
    if (toolName !== "create_ticket") {
      throw { tag: "invalid-args", val: `unknown tool ${toolName}` };
    }
    const { subject, body } = JSON.parse(argsJson);
    console.log(`create_ticket "${subject}" at ${new Date().toISOString()}`);
    const response = guarded(send, {
      method: "POST",
      url: `${base()}/v1/tickets`,
      headers: [{ name: "content-type", value: "application/json" }],
      body: encoder.encode(JSON.stringify({ subject, body })),
    });
    if (response.status < 200 || response.status >= 300) {
      throw { tag: "failed", val: `the ticket desk declined (HTTP ${response.status}): ${decoder.decode(response.body)}` };
    }
    const ticket = JSON.parse(decoder.decode(response.body));
    return JSON.stringify({ ticket_id: ticket.id, subject: ticket.subject });
  },
};

export const reconciler = {
  reconcile(toolName, argsJson, attempt) {
    if (toolName !== "create_ticket") {
      return { tag: "still-unknown", val: `${toolName} has no side effects to reconcile` };
    }
    let response;
    try {
      response = guardedFetch({
        method: "GET",
        url: `${base()}/v1/tickets?external_ref=${encodeURIComponent(attempt.key)}`,
        headers: [],
        body: new Uint8Array(),
      });
    } catch (e) {
      return { tag: "still-unknown", val: `searching the desk failed: ${JSON.stringify(e.payload ?? e)}` };
    }
    if (response.status !== 200) {
      return { tag: "still-unknown", val: `searching the desk answered HTTP ${response.status}` };
    }
    const found = JSON.parse(decoder.decode(response.body)).data.find((t) => t.external_ref === attempt.key);
    if (found === undefined) {
      return { tag: "not-found" };
    }
    return {
      tag: "found",
      val: { status: 201, headers: [{ name: "content-type", value: "application/json" }], body: encoder.encode(JSON.stringify(found)) },
    };
  },
};
