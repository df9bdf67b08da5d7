;; The source of add.wasm (internal/runtime/modules_test.go holds its bytes):
;; wat2wasm add.wat gives them.
(module
  (func (export "add") (param i32 i32) (result i32)
    local.get 0
    local.get 1
    i32.add))
