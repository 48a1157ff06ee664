#!/usr/bin/env sh
# Everything the tests need: the package with its test, ray and triton extras, flashinfer-bench's data models,
# and a headless browser (Debian's chromium) for the HTML report's test. Run from the repository root: `sh tests/setup.sh`.
set -eu
pip install -c constraints.txt -e '.[test,ray,triton]'
# flashinfer-bench's data models, to read the FlashInfer-Trace records a run writes; its own dependencies pull a
# CUDA build of torch and flashinfer, which the models do not import
pip install -c constraints.txt --no-deps 'flashinfer-bench==0.1.2'
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq chromium
fi
