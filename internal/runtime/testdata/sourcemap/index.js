function o(e){if(e==="boom")throw new TypeError("no greeting for boom");return`hello ${e}`}function t(){return new Error("traced").stack}var a={async fetch(e){let r=new URL(e.url).searchParams.get("name")??"world";return r==="trace"?(console.log(t()),new Response("traced")):new Response(o(r))}};export{a as default};
//# sourceMappingURL=index.js.map
