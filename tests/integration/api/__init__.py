"""The REST API's contract: its schema, signing, limits, hostile input, idempotency, its documents."""
