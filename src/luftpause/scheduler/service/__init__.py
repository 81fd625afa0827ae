"""The scheduler's host: gRPC server, single-writer loop, probes, clock, status HTTP."""
