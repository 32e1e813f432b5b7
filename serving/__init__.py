"""HTTP serving: the FastAPI app factory, routes, and a server process for benchmarks and tests."""
