"""GEPA as implemented here: reflective prompt evolution on a per-row Pareto frontier."""
