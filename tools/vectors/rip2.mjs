// rip2.mjs recomputes the rip2 vectors (SPEC 3.5) with JavaScript's own JSON.stringify and
// node:crypto: an implementation independent of the Go code under test. Given the vector file, it
// prints the vectors with every "expect" computed afresh; with --write it rewrites the file.
//
//   node tools/vectors/rip2.mjs testdata/vectors/runtime-input-reference-rip2.json [--write]
import { createHmac, createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";

const [file, flag] = process.argv.slice(2);
const vectors = JSON.parse(readFileSync(file, "utf8"));

const hmac = (key, text) => createHmac("sha256", key).update(Buffer.from(text, "utf8")).digest();

for (const v of vectors) {
  const secret = Buffer.from(v.commitmentSecret, "base64");
  if (secret.length !== 32 || secret.toString("base64") !== v.commitmentSecret) throw new Error(`${v.name}: commitmentSecret is not standard base64 of 32 bytes`);
  const key = hmac(secret, JSON.stringify({
    format: "takoserver.runtime-input-commitment-key.v1", org: v.org, materialSetNonce: v.materialSetNonce,
  }));
  const bindings = {};
  for (const name of Object.keys(v.bindings).sort()) {
    bindings[name] = hmac(key, JSON.stringify({ name, value: v.bindings[name] })).toString("hex");
  }
  const t = v.target;
  const canonical = JSON.stringify({
    format: "takoserver.worker-runtime-input-preflight.v2",
    materialSetNonce: v.materialSetNonce,
    target: {
      space: t.space, workerName: t.workerName, bundleName: t.bundleName, endpointName: t.endpointName,
      originReservationId: t.originReservationId, canonicalPublicOrigin: t.canonicalPublicOrigin,
    },
    bindings,
  });
  const h = createHash("sha256").update(Buffer.from(canonical, "utf8")).digest("hex");
  const prep = "prep-" + h.slice(0, 32);
  v.expect = {
    commitmentKey: key.toString("hex"),
    canonical,
    sha256: h,
    preparationId: prep,
    runtimeInputReference: `rip2.${v.commitmentSecretId}.${prep}.${h}`,
  };
}
const out = JSON.stringify(vectors, null, 2) + "\n";
if (flag === "--write") writeFileSync(file, out);
else process.stdout.write(out);
