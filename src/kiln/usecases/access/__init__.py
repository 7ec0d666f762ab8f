"""Tenancy and access: who the caller is (keys, users, organisations), what they may do, quotas, the audit log and
idempotent requests."""
