"""Usage metering: every attempt's hold and what it cost, and the hourly roll-ups (budgets, which stop work, are
kiln.usecases.budgets)."""
