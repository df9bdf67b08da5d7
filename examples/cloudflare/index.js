// It shows that it received its secret by length and digest, never by value.
export default {
  async fetch(request, env) {
    const sum = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(env.GREETING));
    const hex = [...new Uint8Array(sum)].map((b) => b.toString(16).padStart(2, "0")).join("");
    return new Response(`Hello from Takoform on Cloudflare! My secret has ${env.GREETING.length} characters, SHA-256 ${hex}.\n`);
  },
};
