"""The trace stream: OTLP received (gRPC and HTTP) and forwarded; server request spans stored; agent frameworks'
spans made into sessions and steps, each joined to the server request it made."""
