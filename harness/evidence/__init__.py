"""Per-run Parquet evidence: one schema module, one writer."""
