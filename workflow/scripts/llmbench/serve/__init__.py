"""Serving benchmark: HTTP API dialects, the asyncio load generator and its latency/throughput metrics."""
