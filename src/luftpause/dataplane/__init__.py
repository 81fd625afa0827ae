"""The dataplane: an OpenAI-compatible streaming proxy that admits every turn
through the scheduler (over gRPC; it never imports the scheduler's code)."""
