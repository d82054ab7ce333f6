// What the StarlingMonkey runtime (componentize-js) offers a tool beyond ES2022:
// console output (to the host's log) and text encoding.
declare const console: { log(...data: unknown[]): void; error(...data: unknown[]): void };
declare class TextEncoder {
  encode(input?: string): Uint8Array;
}
declare class TextDecoder {
  decode(input?: Uint8Array): string;
}
declare class URLSearchParams {
  constructor(init?: Record<string, string>);
  toString(): string;
}
