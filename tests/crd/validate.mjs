// Validate Kubernetes objects of the prometheus-operator's kinds (v0.90.1) and KEDA's ScaledObject against their CRD
// schemas (@kubernetes-models: prometheus-operator, keda).
// Usage: node validate.mjs [--crds-only] FILE.yaml...   (multi-document YAML; other kinds are refused, not skipped,
// unless --crds-only: then ci/lint's kubernetes-validate checks them)
// Exit 0 when every object is valid, 1 naming each invalid one.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import { PodMonitor, ServiceMonitor, PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1";

const KINDS = {
  "monitoring.coreos.com/v1": { PodMonitor, ServiceMonitor, PrometheusRule },
  "keda.sh/v1alpha1": { ScaledObject },
};
const crdsOnly = process.argv[2] === "--crds-only";
let failed = 0;
for (const file of process.argv.slice(crdsOnly ? 3 : 2)) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    const obj = doc.toJS();
    if (obj === null) continue;
    const name = `${file}: ${obj.kind}/${obj.metadata?.name}`;
    const Kind = KINDS[obj.apiVersion]?.[obj.kind];
    if (!Kind && crdsOnly && !(obj.apiVersion in KINDS)) continue;
    if (!Kind) {
      console.log(`FAIL ${name}: ${obj.apiVersion} ${obj.kind} is not a kind this checks`);
      failed++;
      continue;
    }
    try {
      new Kind(obj).validate();
      console.log(`ok ${name}`);
    } catch (err) {
      console.log(`FAIL ${name}: ${err.message}`);
      failed++;
    }
  }
}
process.exit(failed ? 1 : 0);
