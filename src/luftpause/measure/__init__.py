"""Measurement as a layer: what the benchmarks and the simulator share to summarise and show."""
