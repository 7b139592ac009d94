"""The pure core: what was read, what is decided, and the report of it. No I/O and no client
library here (import-linter keeps it so); of the rest of `job` only the frozen `job.config`."""
