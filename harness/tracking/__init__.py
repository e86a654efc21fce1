"""Export of finished runs to experiment trackers (MLflow), from their evidence files.

The one code path: `record.read_run` turns a run's evidence folder into a `RunRecord`;
`mlflow_export.export_run` logs it. The harness calls it when a run's evidence is final
(`after_run`), and `python -m harness export mlflow PATH` calls it on evidence that exists."""
