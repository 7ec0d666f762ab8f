"""Notifications: webhooks and e-mail."""
