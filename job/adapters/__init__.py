"""The boundaries: one module per outside thing (the Kubernetes API, each datastore, the grace
state, the Lease, kept reports, Events, metrics, retries), each failing with one error type of its own."""
