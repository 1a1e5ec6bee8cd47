"""The figures: each a pure function of the timelines (no I/O, no clock)."""
