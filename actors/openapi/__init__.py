"""The OpenAPI 3.1 description of the HTTP API, served at /openapi.json.

Kept true by a test: schemathesis runs every route of this document against a
live replica and checks each response against it. ``schemas`` holds the data
shapes, ``paths`` the routes and the document.
"""

from actors.openapi.paths import document

__all__ = ["document"]
