"""tau2-bench retail as a task container (package: data, tools, chat, episode, scoring, container).

Run: `python -m benchmarks.containers.tau2_retail --port 8127 --data-dir /path/to/datasets
      [--user-base-url URL --user-model NAME --user-key-env VAR] [--max-steps 100]`.
"""

from benchmarks.containers.tau2_retail.container import Tau2Retail

__all__ = ["Tau2Retail"]
