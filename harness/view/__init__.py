"""`python -m harness view PATH`: a static, self-contained HTML page built from evidence
alone (a sweep's runs table and charts, or one run's lineage, trace, diffs, proposals and
heldout rows)."""
