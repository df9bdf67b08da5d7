// A dispatch-namespace binding for workerd, which has none (SPEC 8): it is loaded as the internal
// module of a `wrapped` binding whose one inner binding, NAMESPACE, is a service that runs the
// namespace's scripts. get(name, args, options).fetch(request) sends the request to NAMESPACE with
// the script's name and the CPU limit in headers; NAMESPACE answers an unknown script with the
// unknown-script header, which the stub turns into the "Worker not found" error Cloudflare's stub
// throws, and a script that ran past its CPU limit with the limit header, which the stub turns into
// the exception Cloudflare's dispatcher throws then.
const SCRIPT_HEADER = "takoform-dispatch-script";
const CPU_MS_HEADER = "takoform-dispatch-cpu-ms";
const UNKNOWN_HEADER = "takoform-dispatch-unknown";
const LIMIT_HEADER = "takoform-dispatch-limit-exceeded";

export default function (env) {
  return {
    get(name, args, options) {
      const cpuMs = options?.limits?.cpuMs;
      return {
        async fetch(input, init) {
          const request = new Request(input, init);
          const headers = new Headers(request.headers);
          headers.set(SCRIPT_HEADER, name);
          headers.delete(CPU_MS_HEADER);
          if (cpuMs !== undefined) {
            headers.set(CPU_MS_HEADER, String(cpuMs));
          }
          const response = await env.NAMESPACE.fetch(new Request(request, { headers, redirect: "manual" }));
          if (response.headers.get(UNKNOWN_HEADER) === "1") {
            throw new Error("Worker not found.");
          }
          if (response.headers.get(LIMIT_HEADER) === "1") {
            throw new Error("Worker exceeded CPU time limit.");
          }
          return response;
        },
      };
    },
  };
}
