"""Telemetry: OpenTelemetry providers and OTLP exporters (`providers`), and the one builder of KV loss spans
shared by the engine and the collector (`kv_spans`)."""

from kvobs.telemetry.providers import (  # noqa: F401
    DISABLED,
    PROTOCOL_GRPC,
    PROTOCOL_HTTP,
    PROTOCOLS,
    Telemetry,
    TelemetryConfig,
    setup_telemetry,
)
