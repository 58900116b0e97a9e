"""Observers: the consumers of engine step results, one module each.

    observers = [EngineMetrics(...), EngineTracer(...), StoreRecorder(...), KVEventPublisher(...)]
    AsyncEngine(llm_engine, observers=observers)       # each gets every StepResult on the engine thread

| module | observer | turns step results into |
|---|---|---|
| `metrics` | `EngineMetrics` | Prometheus series with vLLM's names and meanings, plus kvobs' own (`/metrics`) |
| `otel_metrics` | `OTelMetricSink` | the same values as OpenTelemetry instruments (a sink of `EngineMetrics`) |
| `spans` | `EngineTracer` | `llm_request` spans with KV span events and links; KV loss spans (`kv_spans`) |
| `store` | `StoreRecorder` | `kv_events`, `requests`, `snapshots`, `sessions` records for the store writer |
| `kv_publisher` | `KVEventPublisher` | vLLM's ZMQ KV-event wire format, with replay |
| `losses` | `LossTally` | counts of lost blocks by reason, and of those lost in a tool pause (the what-if replay) |

Each observer owns a table from engine event type to handler (`dispatch`), registered once in its class; no
other module dispatches on event types. Facts several observers need (is a loss an eviction or an invalidation,
its reasons, whether its owners were in a tool pause) are properties of the events themselves
(`instrumented_engine.engine.events`).
"""
