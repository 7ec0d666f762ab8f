"""Use cases. Each public method owns one transaction; routes call exactly one of them."""
