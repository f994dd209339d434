#!/usr/bin/env bash
# Make the base image docker/Dockerfile builds FROM, without any image registry:
# Debian bookworm (minbase) with Python 3.11, python3-venv, tini and CA
# certificates from Debian's own packages, bootstrapped by mmdebstrap and
# imported into the container engine.
#
#   docker/make-base-image.sh            # skip if the image exists and is current
#   docker/make-base-image.sh --force    # rebuild anyway
#
# Environment:
#   CLAIMD_BASE_IMAGE      tag to create (default localhost/claimd-base:bookworm)
#   CONTAINER_ENGINE       podman (default when installed) or docker
#   DEBIAN_MIRROR          Debian archive URL; default: the one this machine's apt uses
#   DEBIAN_SECURITY_MIRROR security archive URL; default: this machine's, if it has one
#
# Needs root and the mmdebstrap package. The image carries a label with the
# hash of this script, so a changed recipe rebuilds and an unchanged one is
# reused (CI repeats cost nothing).
set -euo pipefail

IMAGE="${CLAIMD_BASE_IMAGE:-localhost/claimd-base:bookworm}"
SUITE=bookworm
PACKAGES=python3,python3-venv,tini,ca-certificates
LABEL=org.claimd.base.recipe
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

ENGINE="${CONTAINER_ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}"
command -v "$ENGINE" >/dev/null || { echo "make-base-image: $ENGINE not found" >&2; exit 2; }

recipe="$(sha256sum "$0" | cut -c1-16)"
have="$("$ENGINE" image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$IMAGE" \
        2>/dev/null || true)"
if [[ $FORCE -eq 0 && "$have" == "$recipe" ]]; then
  echo "make-base-image: $IMAGE is current (recipe $recipe); nothing to do"
  exit 0
fi

command -v mmdebstrap >/dev/null || {
  echo "make-base-image: mmdebstrap not found (apt-get install mmdebstrap)" >&2; exit 2; }

# The mirrors this machine's apt is configured with (one-line .list and deb822
# .sources files), so nothing here names a host: prints "URI SUITE" pairs.
apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] && awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while ($i !~ /\]$/) i++;
                                         if ($2 ~ /^\[/) i++; print $i, $(i + 1) }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] && awk 'BEGIN { RS = ""; FS = "\n" }
      { types = uris = suites = ""
        for (n = 1; n <= NF; n++) {
          if ($n ~ /^Types:/) types = $n; if ($n ~ /^URIs:/) uris = $n
          if ($n ~ /^Suites:/) suites = $n }
        if (types !~ /(^|[ \t])deb([ \t]|$)/ || types ~ /Enabled: *no/) next
        sub(/^URIs:[ \t]*/, "", uris); sub(/^Suites:[ \t]*/, "", suites)
        nu = split(uris, u, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
        for (a = 1; a <= nu; a++) for (b = 1; b <= ns; b++) print u[a], s[b] }' "$f"
  done
}
codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
mirror="${DEBIAN_MIRROR:-$(apt_sources | awk -v c="$codename" '$2 == c { print $1; exit }')}"
security="${DEBIAN_SECURITY_MIRROR:-$(apt_sources | awk '$2 ~ /-security$/ { print $1; exit }')}"
if [[ -z "$mirror" ]]; then
  echo "make-base-image: no Debian mirror in this machine's apt sources; set DEBIAN_MIRROR" >&2
  exit 2
fi
sources=("deb ${mirror%/} $SUITE main" "deb ${mirror%/} $SUITE-updates main")
[[ -n "$security" ]] && sources+=("deb ${security%/} $SUITE-security main")

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "make-base-image: bootstrapping $SUITE from ${mirror} (+ updates${security:+, security})"
# minbase: Essential + Priority required (apt, dpkg, coreutils, passwd, dash).
# No man pages or docs (copyright files stay); mmdebstrap cleans the apt lists.
mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
  --aptopt='APT::Install-Recommends "false"' \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  "$SUITE" "$work/rootfs.tar" "${sources[@]}"

old="$("$ENGINE" image inspect --format '{{ .Id }}' "$IMAGE" 2>/dev/null || true)"
"$ENGINE" import \
  --change "LABEL $LABEL=$recipe" \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  "$work/rootfs.tar" "$IMAGE" >/dev/null
# The replaced image, untagged now; kept if images built on it still exist.
[[ -n "$old" ]] && "$ENGINE" rmi "$old" >/dev/null 2>&1 || true
echo "make-base-image: $IMAGE created (recipe $recipe)"
