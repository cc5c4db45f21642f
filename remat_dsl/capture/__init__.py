"""Stage capture: from a model file to a costed FB-graph (capture, stable names, profile)."""
