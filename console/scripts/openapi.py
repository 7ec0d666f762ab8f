"""Print the Kiln server's OpenAPI document (what it serves at /api/v1/openapi.json) without starting a server.

The console's API types are generated from it at build time (scripts/api-types.mjs runs this with the project's
virtualenv), so a field renamed in the server's schemas fails the console's type check, not a page."""

from __future__ import annotations

import json
import os
import sys
import tempfile


def main() -> None:
    # Building the application reads the settings; give it a home of its own so that nothing of a real one is read
    # or written (the platform itself starts only in the server's lifespan, which never runs here).
    with tempfile.TemporaryDirectory(prefix="kiln-openapi-") as home:
        os.environ["KILN_HOME"] = home
        from kiln.api.app import create_app

        document = create_app().openapi()
    json.dump(document, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
