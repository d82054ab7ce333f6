// Text statistics in JavaScript: a read-only toolguard tool, built with
// plain `componentize-js` (no -d flags). console.log goes to the host's log,
// tagged with the plugin; Date and Math.random are real. The toolchain's
// fetch() is there but sealed: it can reach nothing.

const schema = {
  type: "object",
  properties: { text: { type: "string", maxLength: 65536 } },
  required: ["text"],
  additionalProperties: false,
};

const output = {
  type: "object",
  properties: {
    words: { type: "integer" },
    lines: { type: "integer" },
    longest_word: { type: "string" },
    at_ms: { type: "integer" },
  },
  required: ["words", "lines", "longest_word", "at_ms"],
};

export const tool = {
  describe() {
    return [{
      name: "js_text_stats",
      description: "Counts the words and lines of a text and finds its longest word. Read-only.",
      inputSchema: JSON.stringify(schema),
      outputSchema: JSON.stringify(output),
      effect: "read-only",
    }];
  },
  invoke(toolName, argsJson) {
    if (toolName !== "js_text_stats") {
      throw { tag: "invalid-args", val: `unknown tool ${toolName}` };
    }
    const { text } = JSON.parse(argsJson);
    const trace = Math.floor(Math.random() * 0xffffffff).toString(16).padStart(8, "0");
    // QuickJS builds (componentize-qjs) have no console; StarlingMonkey's logs.
    globalThis.console?.log(`js_text_stats on ${text.length} characters, trace ${trace}`);
    const words = text.split(/\s+/).filter(Boolean);
    const longest = words.reduce((a, w) => (w.length > a.length ? w : a), "");
    return JSON.stringify({
      words: words.length,
      lines: text === "" ? 0 : text.split("\n").length,
      longest_word: longest,
      at_ms: Date.now(),
    });
  },
};
