"""Render a payload into one self-contained HTML file: CSS, the page's JS, the Vega-Lite
runtime (once, run pages only) and the data (one JSON block) all inline, so the page works
offline from disk. Files are written to a temporary name and renamed."""

from __future__ import annotations

import re
from pathlib import Path

import altair as alt
import jinja2
from pydantic import BaseModel

from harness.atomic import atomic_write
from harness.local_model import cache_root

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
GENERATOR = '<meta name="generator" content="gepa-harness view">'  # in base.html.j2: marks our pages


def is_view_page(path: Path) -> bool:
    with open(path, "rb") as handle:
        return GENERATOR.encode() in handle.read(1024)


def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _inline_script(js: str) -> str:
    """JS safe inside <script>: no sequence that would end the element early."""
    return re.sub(r"</(script)", r"<\\/\1", js, flags=re.IGNORECASE).replace("<!--", "<\\!--")


def _scoped(bundle: str) -> str:
    """The bundle declares its helpers at the top level of a classic script; in a function they
    stay out of the page's global scope (it publishes vegaEmbed on window itself)."""
    return _inline_script(f"(function () {{\n{bundle}\n}})();")


def _json_block(payload: BaseModel) -> str:
    # "<" only occurs inside JSON strings, where \u003c means the same: no "</script>" can end the block
    return payload.model_dump_json().replace("<", "\\u003c")


def vega_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one script (vl-convert bundles them for the Vega-Lite
    version Altair writes). Bundling takes seconds, so the result is cached on disk."""
    import vl_convert

    version = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    supported = vl_convert.get_vegalite_versions()
    if version not in supported:  # an Altair newer than vl-convert: its newest runtime reads the specs
        version = supported[-1]
    cached = cache_root() / "view" / f"vega-embed-vl{version}-vlc{vl_convert.__version__}.js"
    if cached.is_file():
        return cached.read_text()
    bundle = vl_convert.javascript_bundle(vl_version=version)
    try:
        atomic_write(cached, bundle.encode())
    except OSError:  # a read-only cache costs seconds per command, not the page
        pass
    return bundle


def render(template: str, payload: BaseModel, *, title: str, scripts: list[str], vega: bool,
           charts: dict[str, object] | None = None) -> str:
    page_js = "\n".join((STATIC / name).read_text() for name in scripts)
    return _environment().get_template(template).render(
        title=title, css=(STATIC / "view.css").read_text(), data_json=_json_block(payload),
        charts_json=_json_block(_Charts(specs=charts or {})), vega_js=_scoped(vega_bundle()) if vega else "",
        page_js=_inline_script(page_js))


class _Charts(BaseModel):
    specs: dict[str, object]


def write_page(path: Path, html: str) -> Path:
    atomic_write(path, html.encode())
    return path
