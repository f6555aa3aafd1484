#!/bin/sh
# Model-checks the journal's lock-free and cooperative code with loom (every interleaving).
set -eu
cd "$(dirname "$0")/.."
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
    cargo test -p journal --lib --release loom -- --nocapture
