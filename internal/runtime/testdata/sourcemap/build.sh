#!/usr/bin/env bash
# Rebuilds index.js and index.js.map from src/ with the esbuild version the fixture was made with:
# a minified one-line bundle and its source map, as a module author's build writes them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
npx --yes esbuild@0.25.12 src/index.js --bundle --format=esm --minify --sourcemap --outfile=index.js
