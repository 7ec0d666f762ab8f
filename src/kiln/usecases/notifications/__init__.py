"""Notifications: subscriptions, the outbox of events (written in the transaction that records what happened), and
sending them."""
