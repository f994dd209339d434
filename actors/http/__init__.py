"""HTTP: every route claimd serves, in one room.

``server`` (the aiohttp app: /metrics, /healthz, /readyz, /api/status, the status
page), ``api`` (the operator API's routes), ``openapi`` (their OpenAPI 3.1
description), ``static/`` (the status page's HTML, CSS and JS).
"""
