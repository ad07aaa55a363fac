"""Millwright worker process: configuration, registration, telemetry and lifecycle."""
