"""Operating the cluster: metrics, health checks, accounting, API tokens, GPU history and idle
flags, waiting out dependency faults."""
