#!/usr/bin/env bash
# Build the claimd image from the repository root: the base image first (made
# locally from Debian's packages, skipped when current), then docker/Dockerfile.
#
#   docker/build-image.sh [TAG]            # default TAG: localhost/claimd:latest
#
# Environment:
#   CONTAINER_ENGINE       engine command with any global flags (default: podman, else docker),
#                          e.g. "podman --runtime runc"
#   CONTAINER_BUILD_FLAGS  extra flags for the build, e.g. "--ulimit nofile=1024:1024"
#   CLAIMD_BASE_IMAGE      base image tag (default localhost/claimd-base:bookworm)
#   CLAIMD_BUILD_CA        CA bundle handed to the build as the `pip_ca` secret, so pip in
#                          the build trusts what this machine trusts (a TLS-inspecting
#                          proxy); default: $PIP_CERT, $SSL_CERT_FILE, else the system bundle
set -euo pipefail
cd "$(dirname "$0")/.."

TAG="${1:-localhost/claimd:latest}"
BASE="${CLAIMD_BASE_IMAGE:-localhost/claimd-base:bookworm}"
read -r -a ENGINE <<< "${CONTAINER_ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}"
read -r -a FLAGS <<< "${CONTAINER_BUILD_FLAGS:-}"

CLAIMD_BASE_IMAGE="$BASE" CONTAINER_ENGINE="${ENGINE[0]}" docker/make-base-image.sh

args=(build --file docker/Dockerfile --tag "$TAG" --build-arg "BASE_IMAGE=$BASE" --network host)
# podman's default OCI image format has no HEALTHCHECK; the docker format keeps it.
[[ "$(basename "${ENGINE[0]}")" == podman ]] && args+=(--format docker)
ca="${CLAIMD_BUILD_CA:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
[[ -n "$ca" && -s "$ca" ]] && args+=(--secret "id=pip_ca,src=$ca")

echo "build-image: ${ENGINE[*]} ${args[*]} ${FLAGS[*]} ."
"${ENGINE[@]}" "${args[@]}" "${FLAGS[@]}" .
