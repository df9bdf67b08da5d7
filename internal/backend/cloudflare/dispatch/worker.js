// The dispatch worker of a wfp-managed installation (SPEC 8). It is the only script the
// installation's base-domain route reaches: it looks the request's hostname up in the routing KV
// namespace (ROUTES) and hands the request to the script the entry names in the dispatch namespace
// (DISPATCHER), with the entry's CPU limit. It runs no user code of its own and never answers with
// one tenant's data for another tenant's hostname.
//
// Bindings: ROUTES (KV namespace), DISPATCHER (dispatch namespace), ROUTE_CACHE_TTL (plain text,
// seconds; the Host counts it in routePropagationSeconds, since a deleted entry may be served from
// the edge cache that long), TAKOFORM_DISPATCH_CONTRACT (plain text: the contract this source
// implements, which the Host reads back before it relies on the Binding entrypoint).
//
// Service bindings between tenant scripts: Cloudflare resolves a `service` binding at account
// scope only, so a namespace script cannot bind to a sibling, and a `dispatch_namespace` binding
// would reach every script of the namespace. A caller's binding is instead a `service` binding to
// this worker's Binding entrypoint with props {calleeScript, calleeUid} that the Host sets at
// upload (props are part of the binding's configuration: the tenant's code cannot change them).
// The entrypoint dispatches to that one script, with the CPU limit of the callee's script entry.

import { WorkerEntrypoint } from "cloudflare:workers";

// The probe header asks for the route alone: the Host's Ready witness that the edge knows the
// hostname. It is answered from the lookup, never dispatched, so no user code runs for it.
const PROBE_HEADER = "takoform-dispatch-probe";

// Cloudflare's smallest cacheTtl for KV reads.
const MIN_CACHE_TTL = 60;

const TITLES = { 404: "Not Found", 502: "Bad Gateway", 503: "Service Unavailable" };

function problem(status, code, detail) {
  return new Response(
    JSON.stringify({ type: "about:blank", title: TITLES[status] ?? "Error", status, code, detail }),
    { status, headers: { "content-type": "application/problem+json", "cache-control": "no-store" } },
  );
}

function cacheTtl(env) {
  const n = Number.parseInt(env.ROUTE_CACHE_TTL ?? "", 10);
  return Number.isFinite(n) && n >= MIN_CACHE_TTL ? n : MIN_CACHE_TTL;
}

// route reads the entry of hostname, or null when there is none or it is not one the Host wrote.
async function route(env, hostname) {
  const raw = await env.ROUTES.get(hostname, { type: "text", cacheTtl: cacheTtl(env) });
  if (raw === null) {
    return null;
  }
  let entry;
  try {
    entry = JSON.parse(raw);
  } catch {
    return null;
  }
  if (entry === null || typeof entry !== "object" || typeof entry.scriptName !== "string" || entry.scriptName === "") {
    return null;
  }
  return entry;
}

// A script's own entry, keyed "script:" + scriptName (no hostname has a colon): {workerUid,
// cpuMs}, written by the Host with every deployment of the worker. Hostname dispatches and binding
// calls read the worker's limit here, so a limit change reaches every route and every caller with
// one write and no re-upload.
const SCRIPT_KEY_PREFIX = "script:";

async function scriptEntry(env, scriptName) {
  const raw = await env.ROUTES.get(SCRIPT_KEY_PREFIX + scriptName, { type: "text", cacheTtl: cacheTtl(env) });
  if (raw === null) {
    return null;
  }
  try {
    const entry = JSON.parse(raw);
    return entry !== null && typeof entry === "object" && typeof entry.workerUid === "string" ? entry : null;
  } catch {
    return null;
  }
}

function isWorkerNotFound(err) {
  return err instanceof Error && err.message.startsWith("Worker not found");
}

// Cloudflare's dispatcher throws when a user Worker exceeds the custom limits it was given.
function isLimitExceeded(err) {
  return err instanceof Error && /exceeded/i.test(err.message) && /cpu|limit/i.test(err.message);
}

function limitOptions(cpuMs) {
  return Number.isInteger(cpuMs) && cpuMs > 0 ? { limits: { cpuMs } } : {};
}

// run dispatches request to scriptName with options, mapping the dispatcher's failures to
// problems; notFound is the problem of an unknown script.
async function run(env, scriptName, options, request, notFound) {
  try {
    return await env.DISPATCHER.get(scriptName, {}, options).fetch(request);
  } catch (err) {
    if (isWorkerNotFound(err)) {
      return notFound();
    }
    if (isLimitExceeded(err)) {
      return problem(503, "worker_exceeded_limits", "the worker exceeded its CPU time limit (limits.cpuMs)");
    }
    // The tenant's exception stays with the tenant: the caller learns only that it failed.
    return problem(502, "worker_failed", "the worker failed to answer");
  }
}

// Binding is the entrypoint a caller's service binding names (props set by the Host at upload).
export class Binding extends WorkerEntrypoint {
  async fetch(request) {
    const props = this.ctx.props ?? {};
    const { calleeScript, calleeUid } = props;
    if (typeof calleeScript !== "string" || calleeScript === "" || typeof calleeUid !== "string") {
      return problem(502, "binding_misconfigured", "the service binding names no callee");
    }
    const entry = await scriptEntry(this.env, calleeScript);
    // Fail closed: without the callee's own entry its limit is unknown, and a script name held by
    // another worker UID (a replaced callee) is not the worker this binding was made for.
    if (entry === null || entry.workerUid !== calleeUid) {
      return problem(503, "binding_unavailable", "the bound worker is not deployed (yet) under this binding's worker UID");
    }
    return run(this.env, calleeScript, limitOptions(entry.cpuMs), request, () =>
      problem(503, "binding_unavailable", "the bound worker is not deployed"));
  }
}

export default {
  async fetch(request, env) {
    const hostname = new URL(request.url).hostname.toLowerCase();
    const entry = await route(env, hostname);
    if (entry === null) {
      return problem(404, "no_route", `no worker is routed to ${hostname}`);
    }
    if (request.headers.has(PROBE_HEADER)) {
      return new Response(JSON.stringify({ hostname, endpointUid: entry.endpointUid ?? null }), {
        headers: { "content-type": "application/json", "cache-control": "no-store" },
      });
    }
    // The worker's limit is its script entry's, the one entry the Host rewrites when the limit
    // changes (a routing entry is written once, at its endpoint's create, and deleted once, so a
    // limit change can never write back an entry an endpoint delete removed). The route's own
    // cpuMs serves a worker that has no script entry yet.
    const own = await scriptEntry(env, entry.scriptName);
    const cpuMs = own !== null ? own.cpuMs : entry.cpuMs;
    return run(env, entry.scriptName, limitOptions(cpuMs), request, () =>
      problem(404, "no_route", `no worker is routed to ${hostname}`));
  },
};
