#!/usr/bin/env bash
# Wheels of sparsescale's dependencies that the GPU image lacks (docs/guide/gpu.md), into .whl/
# at the repository root (keep it out of git: `echo /.whl/ >> .git/info/exclude`), for Python
# 3.12 on x86-64. tests/gpu/check.sh installs them from there; the device tool carries them with
# carry=[".whl"]. Both are pure-Python wheels; their own needs (numpy, scipy, matplotlib,
# requests, torch) are in the image.
set -eu
cd "$(dirname "$0")/../.."
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl mnist1d==0.0.2.post1 torch-pruning==1.6.1
ls -l .whl
