"""Usage metering and its hourly roll-ups."""
