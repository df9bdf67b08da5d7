// The Takoform router: the runtime node's own worker in every organization's workerd process
// (SPEC 5). It never runs a tenant's code itself: it loads each of the organization's incarnations
// as a dynamic isolate through the Worker Loader, under the loader id the runtime names, with code
// and secrets fetched from the runtime over the process's own socket, and hands it each request.
//
// Every isolate's network goes through the Egress entrypoint (its globalOutbound, never omitted:
// an omitted one would inherit this worker's), its service bindings through the Binding
// entrypoint, and its logs through the Tail entrypoint. Each stamps what it forwards with the
// isolate's loader id from its props, which the router set at load time and the isolate cannot
// change, after removing every takoform-* header the isolate wrote.
import { WorkerEntrypoint } from "cloudflare:workers";

const LOADER = "takoform-loader";
const BINDING = "takoform-binding";
const INCARNATION = "takoform-incarnation";
const PROBE = "takoform-probe";
const LIVENESS = "takoform-liveness";
const ADMIT = "takoform-admit";
const CALLEE = "takoform-callee";
const CALL = "takoform-call";
const DEADLINE = "takoform-deadline";
const ELSEWHERE = "takoform-elsewhere";
const ENDED = "takoform-ended";
const SCHEDULED = "takoform-scheduled";
const SCHEDULED_TIME = "takoform-scheduled-time";
const BINDINGS_URL = "http://bindings.takoform.invalid/";
// NO_CODE marks a load that failed because the runtime gave no code (a retired or foreign id),
// which says nothing of the code itself.
const NO_CODE = "takoform: the runtime node gave no code for ";

// withoutOurs copies headers without the runtime's own (takoform-*): no isolate writes one that
// the runtime reads, and no client's reaches an isolate.
function withoutOurs(headers) {
  const out = new Headers(headers);
  for (const name of [...out.keys()]) {
    if (name.startsWith("takoform-")) out.delete(name);
  }
  return out;
}

// forward is request with other headers, never following a redirect (the caller follows, or the
// client sees it).
function forward(request, headers) {
  return new Request(request, { headers, redirect: "manual" });
}

export class Egress extends WorkerEntrypoint {
  fetch(request) {
    const headers = withoutOurs(request.headers);
    headers.set(LOADER, this.ctx.props.loader);
    return this.env.EGRESS.fetch(forward(request, headers));
  }
}

// Binding runs a service binding call. The runtime admits it first (the caller's subrequest
// meter, the loop count, the callee's current Ready incarnation), and it then calls the callee's
// isolate in this process itself; the runtime keeps the call counted until told its end. A callee
// in another process (one running alone) gets the call sent whole, through the runtime.
export class Binding extends WorkerEntrypoint {
  async fetch(request) {
    const headers = withoutOurs(request.headers);
    const stamp = { [LOADER]: this.ctx.props.loader, [BINDING]: this.ctx.props.binding };
    // The admission carries every end the runtime may not have read yet (one a report is still
    // carrying too): the runtime reads them first, so no count it checks is stale.
    const carried = ended;
    ended = [];
    const admit = { ...stamp, [ADMIT]: "1" };
    if (carried.length) admit[ENDED] = carried.join(",");
    let admitted;
    try {
      admitted = await this.env.BINDINGS.fetch(BINDINGS_URL, { headers: admit });
    } catch (e) {
      ended = carried.concat(ended);
      throw e;
    }
    const callee = admitted.headers.get(CALLEE);
    if (!callee) {
      if (!admitted.headers.has(ELSEWHERE)) return admitted;
      headers.set(LOADER, stamp[LOADER]);
      headers.set(BINDING, stamp[BINDING]);
      return this.env.BINDINGS.fetch(forward(request, headers));
    }
    let answered = false;
    let late = false;
    let timer;
    try {
      const limit = new Promise((resolve) => {
        timer = setTimeout(() => { late = true; resolve(); }, Number(admitted.headers.get(DEADLINE)));
      });
      // Made again only in time, and without a body (the first attempt took it).
      const answer = call(this.env, this.ctx, callee, (w) => w.getEntrypoint().fetch(forward(request, headers)),
        () => !late && request.body === null);
      const response = await Promise.race([answer, limit]);
      if (!response) return problem(504, "response_timeout", "Gateway Timeout", "the worker did not answer within the runtime node's response time limit");
      answered = true;
      return response;
    } catch (e) {
      // The callee's tail has the exception; the caller gets no more of it than a client would.
      return failed(e);
    } finally {
      clearTimeout(timer);
      ended.push(admitted.headers.get(CALL) + (answered ? ":1" : ":0"));
      if (!reporting) {
        reporting = true;
        this.ctx.waitUntil(reportEnded(this.env));
      }
    }
  }
}

// ended are the calls run here whose end the runtime may not have read yet: the next admission
// carries them, or reportEnded a moment later when none comes. An end stays listed until the
// runtime answered the request that carried it (a second reading of one is nothing).
let ended = [];
let reporting = false;

async function reportEnded(env) {
  await new Promise((resolve) => setTimeout(resolve, 20));
  reporting = false;
  if (!ended.length) return;
  const carried = ended.slice();
  await env.BINDINGS.fetch(BINDINGS_URL, { method: "POST", headers: { [ENDED]: carried.join(",") } });
  ended = ended.filter((e) => !carried.includes(e));
}

// failed answers a request whose isolate threw (500), or could not be loaded for want of code or
// is being loaded afresh (503).
function failed(e) {
  const gone = e instanceof Reloading || String((e && e.message) || e).includes(NO_CODE);
  const headers = { "content-type": "text/plain" };
  if (e instanceof Reloading) headers["retry-after"] = "1";
  return new Response(gone ? "Service Unavailable" : "Internal Server Error", { status: gone ? 503 : 500, headers });
}

// problem is an answer of the runtime's own, as the edge writes them.
function problem(status, code, title, detail) {
  return Response.json({ type: "urn:takoform:problem:runtime:" + code, title, status, detail, code }, {
    status, headers: { "content-type": "application/problem+json" },
  });
}

export class Tail extends WorkerEntrypoint {
  async tail(events) {
    // Only console lines and uncaught exceptions are kept: a request that has neither costs no
    // delivery (most requests of most workers).
    if (!events.some((e) => e.logs?.length || e.exceptions?.length)) return;
    const body = JSON.stringify(events, (_, v) => (typeof v === "bigint" ? v.toString() : v));
    await this.env.TAILS.fetch("http://tails.takoform.invalid/", {
      method: "POST", headers: { [LOADER]: this.ctx.props.loader }, body,
    });
  }
}

// module is one module as the Worker Loader takes it. WebAssembly and data modules come base64.
function module(m) {
  switch (m.type) {
    case "json":
      return { json: JSON.parse(m.value) };
    case "text":
      return { text: m.value };
    case "wasm":
      return { wasm: bytes(m.value) };
    case "data":
      return { data: bytes(m.value) };
    default:
      return { js: m.value };
  }
}

// bytes is standard base64 decoded, as an ArrayBuffer.
function bytes(b64) {
  const s = atob(b64);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out.buffer;
}

// load is the isolate of loader id `id`, loaded on first use from the code the runtime gives,
// under the name it has now (see call).
function load(env, ctx, id) {
  const key = names.get(id) ?? id;
  const stub = env.LOADER.get(key, async () => {
    const r = await env.CODE.fetch("http://code.takoform.invalid/" + encodeURIComponent(id));
    if (r.status !== 200) throw new Error(NO_CODE + id + " (" + r.status + ")");
    const c = await r.json();
    const bindings = { ...c.text };
    for (const [name, value] of Object.entries(c.json)) bindings[name] = JSON.parse(value);
    for (const name of c.services) {
      bindings[name] = ctx.exports.Binding({ props: { loader: id, binding: name } });
    }
    const modules = {};
    for (const m of c.modules) modules[m.name] = module(m);
    return {
      compatibilityDate: c.compatibilityDate,
      compatibilityFlags: c.compatibilityFlags,
      mainModule: c.mainModule,
      modules,
      env: bindings,
      globalOutbound: ctx.exports.Egress({ props: { loader: id } }),
      tails: [ctx.exports.Tail({ props: { loader: id } })],
    };
  });
  return { stub, key };
}

// names are the names isolates are loaded under now, by loader id (absent: the id itself), and
// renamed when each was last given a new one (ms).
const names = new Map();
const renamed = new Map();
let generation = 0;

// RENAME_EVERY bounds how often one isolate is loaded afresh: a client that leaves during every
// load it starts would otherwise have the runtime read and send the worker's code (up to 10 MiB)
// once per request. Within it, calls answer 503 until the next may load it.
const RENAME_EVERY = 1000;

const CANCELED = "The execution context responding to this call was canceled";

// Reloading ends a call whose isolate is loaded afresh when the call cannot be made again (a
// request's body went to the canceled load): the client may retry.
class Reloading extends Error {}

// call calls the isolate of loader id `id` through use. A load runs in the request that asked
// for it first, and is canceled with that request when its client leaves (ctx.waitUntil does not
// keep it); the Worker Loader then keeps the canceled load under its name, and every later call
// answers CANCELED. So a call that answers CANCELED, to an isolate that does not answer a probe
// either (none started: no code of the tenant's ran), loads it under a new name (at most once per
// RENAME_EVERY), and is made once more when again() allows. A CANCELED from an isolate that
// answers its probe is the isolate's own.
async function call(env, ctx, id, use, again = () => true) {
  const first = load(env, ctx, id);
  try {
    return await use(first.stub);
  } catch (e) {
    if (!canceled(e) || !(await neverStarted(env, first.stub))) throw e;
    if ((names.get(id) ?? id) === first.key) {
      if (Date.now() - (renamed.get(id) ?? -Infinity) < RENAME_EVERY) throw new Reloading();
      names.set(id, id + "~" + ++generation);
      renamed.set(id, Date.now());
    }
    if (!again()) throw new Reloading();
    return use(load(env, ctx, id).stub);
  }
}

function canceled(e) {
  return String((e && e.message) || e).includes(CANCELED);
}

// neverStarted reports whether the isolate behind stub never started: a probe of it answers
// CANCELED rather than "no such entrypoint".
async function neverStarted(env, stub) {
  try {
    await stub.getEntrypoint(env.PROBE_ENTRYPOINT).fetch("http://probe.takoform.invalid/");
    return false;
  } catch (e) {
    return canceled(e);
  }
}

// probe loads an incarnation and calls an entrypoint no module exports (its name is chosen per
// process): loading compiles the modules and evaluates their top level, and "no such
// entrypoint" then means the code is ready, without running any handler of the tenant's.
async function probe(env, ctx, id) {
  try {
    await call(env, ctx, id, (w) => w.getEntrypoint(env.PROBE_ENTRYPOINT).fetch("http://probe.takoform.invalid/"));
    return { outcome: "failed", message: "the worker answered a probe it should not have been able to" };
  } catch (e) {
    const message = String((e && e.message) || e);
    if (message.startsWith("Worker has no such entrypoint")) return { outcome: "ready" };
    if (message.includes(NO_CODE)) return { outcome: "unavailable", message };
    return { outcome: "failed", message };
  }
}

// scheduled runs one cron tick of an isolate: its scheduled handler, through this worker's own
// service_binding_extra_handlers flag. Only the runtime asks (the edge removes every takoform-*
// header a client sends). What the handler printed, or the exception it threw, reaches its log
// through its tail; the answer says only which it was.
async function scheduled(env, ctx, id, cron, time) {
  try {
    const r = await call(env, ctx, id, (w) => w.getEntrypoint().scheduled({ cron, scheduledTime: new Date(time) }));
    if (r.outcome === "ok") return { outcome: "ok" };
    return { outcome: "exception", message: "the scheduled handler ended " + r.outcome };
  } catch (e) {
    return { outcome: "exception", message: String((e && e.message) || e) };
  }
}

export default {
  async fetch(request, env, ctx) {
    if (request.headers.has(LIVENESS)) return new Response("alive");
    const probed = request.headers.get(PROBE);
    if (probed) return Response.json(await probe(env, ctx, probed));
    const id = request.headers.get(INCARNATION);
    if (!id) return new Response("no incarnation named", { status: 404 });
    const cron = request.headers.get(SCHEDULED);
    if (cron !== null) return Response.json(await scheduled(env, ctx, id, cron, Number(request.headers.get(SCHEDULED_TIME))));
    try {
      const headers = withoutOurs(request.headers);
      return await call(env, ctx, id, (w) => w.getEntrypoint().fetch(new Request(request, { headers, redirect: "manual", cf: {} })),
        () => request.body === null);
    } catch (e) {
      // The isolate's tail has the exception; nothing of it reaches the client or this
      // process's output.
      return failed(e);
    }
  },
};
