"""What one command does, start to end, wiring the core and the boundaries: a run, its apply, a restore."""
