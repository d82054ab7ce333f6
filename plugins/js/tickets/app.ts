// Support tickets in TypeScript: a guarded tool against a ticket desk that
// ignores idempotency keys (as most ticket, e-mail and chat APIs do). Built
// with plain `componentize-js` (no -d flags), world `reconciling-plugin`,
// after a type check against the contract's generated types and a bundle.
//
// - `create_ticket` (irreversible): POST /v1/tickets through the guard's
//   `send`. The host puts its key in the JSON body's `external_ref` (the
//   downstream's `json-field` key transport) and, since the desk does not
//   deduplicate (`honours_keys = false`), never re-sends blindly: a repeat
//   replays the recorded ticket, and an unknown outcome is reconciled.
// - its reconciler searches the desk for the ticket carrying the attempt's key.

import { defineTool, failed, fetch, found, getRequest, json, jsonRequest, ok, reconcilerExport } from "../sdk/toolguard";
import { requiredConfig, send, text, toolExport } from "../sdk/toolguard";

interface TicketArgs {
  subject: string;
  body: string;
}

interface DeskTicket {
  id: string;
  subject: string;
  external_ref?: string;
}

const base = () => requiredConfig("api_base").replace(/\/+$/, "");

const createTicket = defineTool<TicketArgs, { ticket_id: string; subject: string }>({
  name: "create_ticket",
  description:
    "Opens a support ticket. Irreversible: every successful call opens a new ticket. " +
    "If the outcome is reported unknown, do not call it again: the host checks the desk first.",
  effect: "irreversible",
  input: {
    type: "object",
    properties: { subject: { type: "string", minLength: 1, maxLength: 200 }, body: { type: "string", maxLength: 10000 } },
    required: ["subject", "body"],
    additionalProperties: false,
  },
  output: {
    type: "object",
    properties: { ticket_id: { type: "string" }, subject: { type: "string" } },
    required: ["ticket_id", "subject"],
  },
  run({ subject, body }) {
    console.log(`create_ticket "${subject}" at ${new Date().toISOString()}`);
    const response = send(jsonRequest("POST", `${base()}/v1/tickets`, { subject, body }));
    if (!ok(response)) {
      failed(`the ticket desk declined (HTTP ${response.status}): ${text(response)}`);
    }
    const ticket = json<DeskTicket>(response);
    return { ticket_id: ticket.id, subject: ticket.subject };
  },
  reconcile(_args, attempt) {
    const response = fetch(getRequest(`${base()}/v1/tickets`, { external_ref: attempt.key }));
    if (response.status !== 200) {
      return { tag: "still-unknown", val: `searching the desk answered HTTP ${response.status}` };
    }
    const match = json<{ data: DeskTicket[] }>(response).data.find((t) => t.external_ref === attempt.key);
    return match === undefined ? { tag: "not-found" } : found(match, 201);
  },
});

const tools = [createTicket];
export const tool = toolExport(tools);
export const reconciler = reconcilerExport(tools);
