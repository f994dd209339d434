"""The container's HEALTHCHECK: GET /healthz on the address claimd serves HTTP on.

The image has no curl; this uses the standard library only. The address is
``CLAIMD_HTTP`` (the image sets it; it overrides the config file), with a
wildcard host asked on loopback. Exit 0 when /healthz answers 200, else 1 with
one line saying why (Docker and podman keep it in the health log).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def healthz_url(http: str) -> str | None:
    """The /healthz URL for a ``host:port`` setting, or None when HTTP is off."""
    if http.strip().lower() == "off":
        return None
    host, _, port = http.rpartition(":")
    host = "127.0.0.1" if host in WILDCARDS else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/healthz"


def main() -> int:
    url = healthz_url(os.environ.get("CLAIMD_HTTP", "0.0.0.0:8780"))
    if url is None:
        print("unhealthy: CLAIMD_HTTP is off, so there is no /healthz to ask")
        return 1
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"unhealthy: {url}: {exc}")
        return 1
    if status != 200:
        print(f"unhealthy: {url} answered {status}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
