"""Reference task containers: small HTTP services speaking the task contract (see kit/)."""
