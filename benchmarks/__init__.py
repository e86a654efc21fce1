"""Reference task containers and benchmark report code."""
