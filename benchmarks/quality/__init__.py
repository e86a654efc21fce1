"""Optimizer quality: heldout lift of each run's own pick over seeds (see __main__)."""
