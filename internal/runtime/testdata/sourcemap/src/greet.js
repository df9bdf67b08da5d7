// The module whose lines the source-map test looks for in the worker's log: greet throws on line
// 5, and whereAmI makes its stack on line 11.

export function greet(name) {
  if (name === "boom") throw new TypeError("no greeting for boom");
  return `hello ${name}`;
}

export function whereAmI() {
  // The stack of an error made here, printed by the caller.
  return new Error("traced").stack;
}
