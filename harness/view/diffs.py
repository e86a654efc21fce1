"""Side-by-side diffs of candidate texts with difflib's HtmlDiff (it escapes the text). Each
pair is diffed once: a child of the seed has the same diff against its parent and against
the seed, and the page stores it once."""

from __future__ import annotations

import difflib
import html

CONTEXT_LINES = 3  # unchanged lines kept around each change; prompts grow by a few lines per edit


class DiffStore:
    """HTML tables keyed by the two candidate ids."""

    def __init__(self) -> None:
        self.tables: dict[str, str] = {}
        self._differ = difflib.HtmlDiff()

    def add(self, old_id: str, old: dict[str, str], new_id: str, new: dict[str, str]) -> str:
        key = f"{old_id}:{new_id}"
        if key not in self.tables:
            self.tables[key] = self._render(old_id, old, new_id, new)
        return key

    def _render(self, old_id: str, old: dict[str, str], new_id: str, new: dict[str, str]) -> str:
        parts = []
        for module in sorted(set(old) | set(new)):
            before, after = old.get(module, ""), new.get(module, "")
            if before == after:
                continue
            table = self._differ.make_table(before.splitlines(), after.splitlines(), f"{old_id} · {module}",
                                            f"{new_id} · {module}", context=True, numlines=CONTEXT_LINES)
            # HtmlDiff keeps spaces as &nbsp;, which never wrap; the page's CSS (pre-wrap) keeps
            # them and wraps long prompt lines at word boundaries to the column's width
            parts.append(f'<h4 class="diff-module">{html.escape(module)}</h4>{table.replace("&nbsp;", " ")}')
        if not parts:
            return f'<p class="muted">{html.escape(new_id)} has the same text as {html.escape(old_id)}.</p>'
        return "".join(parts)

