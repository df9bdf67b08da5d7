# A runtime input is imported by its operation id. The values are never read back: leave
# bindings_wo unset in the imported configuration to keep what is sealed.
tofu import takoform_worker_runtime_input.api rip-0123456789abcdef01234567
