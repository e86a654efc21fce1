"""The headless browser the view's tests and benchmark open pages in: the system's Chromium
(Debian's `chromium` package, installed by .ci/setup) driven by Playwright, which is told
where it is and never downloads a browser of its own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Debian's /usr/bin/chromium is a shell wrapper; the binary itself starts quieter
CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str | None:
    """$HARNESS_CHROMIUM, else the first Chromium found; None when there is none."""
    configured = os.environ.get("HARNESS_CHROMIUM")
    if configured:
        return configured
    for name in CANDIDATES:
        found = name if Path(name).is_file() and os.access(name, os.X_OK) else shutil.which(name)
        if found:
            return found
    return None
