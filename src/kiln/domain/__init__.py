"""Pure domain: job specs, states and the transition table. No I/O here."""
