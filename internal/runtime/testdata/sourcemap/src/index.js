import { greet, whereAmI } from "./greet.js";

export default {
  async fetch(request) {
    const name = new URL(request.url).searchParams.get("name") ?? "world";
    if (name === "trace") {
      console.log(whereAmI());
      return new Response("traced");
    }
    return new Response(greet(name));
  },
};
