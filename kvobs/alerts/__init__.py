"""Alerting over the store: YAML rules (`rules`), the values they compare (`signals`), the evaluator that writes
transitions to the `alerts` table (`evaluator`), and sinks (`sinks`: log, webhook)."""
