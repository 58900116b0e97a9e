"""The metrics stream: each replica's Prometheus `/metrics` scraped, parsed, turned into snapshots, counter
samples and engine runs."""
