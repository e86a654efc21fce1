"""How `python -m harness view` scales: synthetic evidence of a large sweep and a long run,
its pages' size, build time and load time in headless Chromium (`python -m benchmarks.view`)."""
