// Validate KEDA objects (JSON list on stdin) against KEDA's CRD schemas from @kubernetes-models/keda, installed by
// scripts/deploy-tools.sh into tools/keda. Usage: node keda_validate.mjs <tools/keda> < objects.json
// Prints one line per object; exits 1 when any object fails, with the schema's complaint.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const root = process.argv[2];
const models = await import(pathToFileURL(join(root, "node_modules/@kubernetes-models/keda/keda.sh/v1alpha1/index.js")).href);
const docs = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const doc of docs) {
  const Model = models[doc.kind];
  const name = `${doc.kind}/${doc.metadata?.name}`;
  if (!Model) {
    console.log(`FAIL ${name}: not a keda.sh/v1alpha1 kind`);
    failed++;
    continue;
  }
  try {
    new Model(doc).validate();
    console.log(`ok ${name}`);
  } catch (err) {
    console.log(`FAIL ${name}: ${err.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
