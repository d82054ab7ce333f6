// Writes the TypeScript declarations of the plugin contract (jco's guest
// types: what a component implementing the world imports and exports).
//
//   node gen-types.mjs <node_modules dir with @bytecodealliance/jco> <wit dir> <world> <out dir>
//
// The same as `jco guest-types <wit> -n <world> -o <out>`, which under jco
// 1.35.0 cannot read any WIT path: its bundled WASI shim (preview2-shim
// 0.26) starts with no preopened directories. Here the shim gets one, `/`,
// and jco's own type generator runs unchanged.
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, wit, world, out] = process.argv.slice(2);
if (!out) {
  console.error("usage: node gen-types.mjs <node_modules> <wit dir> <world> <out dir>");
  process.exit(2);
}
const transpile = join(resolve(modules), "@bytecodealliance/jco-transpile");
const shim = join(transpile, "node_modules/@bytecodealliance/preview2-shim/dist/nodejs/filesystem.js");
const { _setPreopens } = await import(pathToFileURL(shim).href);
_setPreopens({ "/": "/" });
const { generateGuestTypes } = await import(pathToFileURL(join(transpile, "dist/index.js")).href);
const files = await generateGuestTypes(resolve(wit), { worldName: world, outDir: "" });
for (const [name, text] of Object.entries(files)) {
  const path = join(out, name);
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
}
