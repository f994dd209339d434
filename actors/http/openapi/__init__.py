"""The HTTP surface declared once: its routes, the pydantic models of every request and answer,
and the OpenAPI 3.1 document built from both, served at /openapi.json.

``fields`` holds the values (each pattern is both the server's check and the
document's), ``requests`` and ``responses`` the models, ``operations`` the
routes with their statuses and links, ``document`` the document. Kept true by
a test: schemathesis runs every route against a live replica with all its
checks, with a token and without.
"""

from actors.http.openapi.document import document
from actors.http.openapi.operations import BY_ID, OPERATIONS, Operation, Scope, scope_of

__all__ = ["BY_ID", "OPERATIONS", "Operation", "Scope", "document", "scope_of"]
