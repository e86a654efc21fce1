"""Sweeps: axes expanded into run specs by our code, scheduled on Ray actors, resumable."""
