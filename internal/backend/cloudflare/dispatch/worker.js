// The dispatch worker of a wfp-managed installation (SPEC 8). It is the only script the
// installation's base-domain route reaches: it looks the request's hostname up in the routing KV
// namespace (ROUTES) and hands the request to the script the entry names in the dispatch namespace
// (DISPATCHER), with the entry's CPU limit. It runs no user code of its own and never answers with
// one tenant's data for another tenant's hostname.
//
// Bindings: ROUTES (KV namespace), DISPATCHER (dispatch namespace), ROUTE_CACHE_TTL (plain text,
// seconds; the Host counts it in routePropagationSeconds, since a deleted entry may be served from
// the edge cache that long).

// The probe header asks for the route alone: the Host's Ready witness that the edge knows the
// hostname. It is answered from the lookup, never dispatched, so no user code runs for it.
const PROBE_HEADER = "takoform-dispatch-probe";

// Cloudflare's smallest cacheTtl for KV reads.
const MIN_CACHE_TTL = 60;

function problem(status, code, detail) {
  return new Response(
    JSON.stringify({ type: "about:blank", title: status === 404 ? "Not Found" : "Bad Gateway", status, code, detail }),
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

function isWorkerNotFound(err) {
  return err instanceof Error && err.message.startsWith("Worker not found");
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
    const options = {};
    if (Number.isInteger(entry.cpuMs) && entry.cpuMs > 0) {
      options.limits = { cpuMs: entry.cpuMs };
    }
    let worker;
    try {
      worker = env.DISPATCHER.get(entry.scriptName, {}, options);
      return await worker.fetch(request);
    } catch (err) {
      if (isWorkerNotFound(err)) {
        return problem(404, "no_route", `no worker is routed to ${hostname}`);
      }
      // The tenant's exception stays with the tenant: the caller learns only that it failed.
      return problem(502, "worker_failed", "the worker failed to answer");
    }
  },
};
