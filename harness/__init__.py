"""Experiment harness for reflective prompt optimization against HTTP task containers."""
