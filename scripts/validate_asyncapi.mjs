// Validate an AsyncAPI document with the reference parser (@asyncapi/parser), resolving its
// relative $refs from the file's own folder. Prints one JSON line: {"errors": [...], "warnings": n,
// "channels": [...], "messages": n}; exits 1 when the parser reports an error.
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { Parser, fromFile } from "@asyncapi/parser";

const path = resolve(process.argv[2] ?? "schemas/asyncapi.yaml");
const parser = new Parser();
const { document, diagnostics } = await fromFile(parser, path).parse({
  validateOptions: { allowedSeverity: { error: false, warning: true, info: true, hint: true } },
});
const errors = diagnostics.filter((d) => d.severity === 0).map((d) => `${d.path.join(".")}: ${d.message}`);
const out = {
  errors,
  warnings: diagnostics.filter((d) => d.severity === 1).map((d) => `${d.path.join(".")}: ${d.message}`),
  channels: document ? document.channels().all().map((c) => c.address()) : [],
  messages: document ? document.allMessages().length : 0,
};
readFileSync(path); // the file must exist even when the parser tolerated a missing one
console.log(JSON.stringify(out));
process.exit(errors.length || !document ? 1 : 0);
