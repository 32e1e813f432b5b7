"""HTTP routes: one module per concern, each exposing ``router``."""
