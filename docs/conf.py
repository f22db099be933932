"""Sphinx configuration of volsample's documentation site.

Build it from an environment where volsample and its ``docs`` extra are installed (the
README's editable ``dev`` install holds it)::

    pip install -e ".[dev]"
    python -m sphinx -W -b html docs build/docs

The API reference is written at build time (``_write_api_pages``) from the package itself:
every public module gets a page listing its public names, by the rule of
``volsample._public`` (which the tests read too), so a new public function or module
appears without an edit here. The Markdown pages (``docs/*.md``) and the README's
sections are read by MyST; the gallery (``docs/examples/plot_*.py``) runs at build time.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import volsample
from volsample import _public

project = "volsample"
author = "the volsample authors"
copyright = "the volsample authors"
release = volsample.__version__
version = release

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = [
    "_build",
    "examples",
    "sg_execution_times.rst",
]  # gallery sources: sphinx-gallery reads them
templates_path: list[str] = []

# -- MyST: the Markdown pages -----------------------------------------------------------
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3  # links to a page's sections (#semantics-of-...) resolve

# -- API reference ------------------------------------------------------------------------
autosummary_generate = True
autodoc_typehints = "none"  # numpydoc's Parameters section says it; signatures stay short
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

intersphinx_mapping: dict[str, tuple[str, str | None]] = {}  # the build reads nothing remote


def _public_modules() -> list[str]:
    """The public modules (``volsample._public``), less those whose every public name the
    package itself offers (``volsample.grid_sample`` holds ``volsample.grid_sample_3d``)."""
    top = set(volsample.__all__)
    kept = []
    for name in _public.module_names():
        documented, constants = _public.names(importlib.import_module(name))
        if name == "volsample" or not set(documented) | set(constants) <= top:
            kept.append(name)
    return kept


def _module_page(name: str) -> str:
    module = importlib.import_module(name)
    documented, constants = _public.names(module)
    if name != "volsample":  # what the package itself offers is documented there, once
        documented = [
            n for n in documented if getattr(volsample, n, None) is not getattr(module, n)
        ]
    lines = [
        name,
        "=" * len(name),
        "",
        f".. automodule:: {name}",
        "   :no-members:",
        "",
        f".. currentmodule:: {name}",
        "",
    ]
    if documented:
        lines += [".. autosummary::", "   :toctree: generated", "   :nosignatures:", ""]
        lines += [f"   {n}" for n in documented] + [""]
    if constants:
        lines += [
            "Constants",
            "---------",
            "",
            ".. list-table::",
            "   :header-rows: 1",
            "",
            "   * - name",
            "     - value",
        ]
        for n in constants:
            lines += [f"   * - ``{n}``", f"     - ``{getattr(module, n)!r}``"]
        lines.append("")
    return "\n".join(lines)


def _write_api_pages(app, config) -> None:
    out = Path(app.srcdir) / "api"
    out.mkdir(exist_ok=True)
    modules = _public_modules()
    pages = {
        "index": "\n".join(
            [
                "API reference",
                "=============",
                "",
                "Every public module of the package; each page lists the module's public functions "
                "and classes, with their full documentation one click away.",
                "",
                ".. toctree::",
                "   :maxdepth: 1",
                "",
            ]
            + [f"   {m}" for m in modules]
            + [""]
        )
    }
    pages.update({m: _module_page(m) for m in modules})
    for stem, text in pages.items():
        path = out / f"{stem}.rst"
        if not path.exists() or path.read_text() != text:  # unchanged pages stay up to date
            path.write_text(text)


def _write_charts(app, config) -> None:
    """The performance page's charts (docs/charts/*.png), drawn from the recorded runs in
    benchmarks/results/ by benchmarks/figures.py, the script that draws the documents'
    figures from them."""
    root = Path(app.srcdir).parent
    spec = importlib.util.spec_from_file_location("figures", root / "benchmarks" / "figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    figures.write_charts(Path(app.srcdir) / "charts")


def setup(app):
    # Before Sphinx looks for source files (and autosummary writes the stub pages of what
    # these pages list).
    app.connect("config-inited", _write_api_pages)
    app.connect("config-inited", _write_charts)


# -- Gallery: examples that run at build time and draw their figures -------------------
sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_memory": False,
    "write_computation_times": False,
    "capture_repr": (),  # print() shows what an example means to show, nothing else
}

# -- HTML ---------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"volsample {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "header_links_before_dropdown": 6,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
html_static_path = ["_static"]
html_css_files = ["performance.css"]  # the performance page's tables of figures
# The guide's pages have no subpages: no left column (its "Section Navigation" would be
# empty), so their wide tables get the room. The API and the gallery keep theirs.
html_sidebars = {"*": []}
