"""Optimizers behind one protocol. No Ray or Hydra here: an optimizer sees only a run context."""
