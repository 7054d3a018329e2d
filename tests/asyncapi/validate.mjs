// Parse an AsyncAPI document with the AsyncAPI project's own parser (@asyncapi/parser), so
// schemas/asyncapi.json is checked by the tool its readers use, not by our idea of the spec.
// Usage: node tests/asyncapi/validate.mjs <document>. Prints every diagnostic (warnings too);
// exits 1 if any is an error or the parser produced no document, 2 on bad usage.
import { DiagnosticSeverity, Parser, fromFile } from '@asyncapi/parser';

const SEVERITY = {
  [DiagnosticSeverity.Error]: 'error',
  [DiagnosticSeverity.Warning]: 'warning',
  [DiagnosticSeverity.Information]: 'info',
  [DiagnosticSeverity.Hint]: 'hint',
};

const file = process.argv[2];
if (!file || process.argv.length > 3) {
  console.error('usage: node validate.mjs <asyncapi document>');
  process.exit(2);
}

const { document, diagnostics } = await fromFile(new Parser(), file).parse();
for (const d of diagnostics) {
  const where = d.path.length ? d.path.join('.') : '(document)';
  console.log(`${SEVERITY[d.severity] ?? d.severity} ${d.code} at ${where}: ${d.message}`);
}
const errors = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
if (errors.length || !document) {
  console.log(`${file}: INVALID (${errors.length} error(s))`);
  process.exit(1);
}
console.log(
  `${file}: valid AsyncAPI ${document.version()} (${document.channels().length} channels, ` +
    `${document.operations().length} operations, ${document.messages().length} messages, ` +
    `${diagnostics.length - errors.length} warning(s)/hint(s))`,
);
