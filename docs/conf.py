"""Sphinx configuration of volsample's documentation site.

Build it from an environment where volsample and its ``docs`` extra are installed::

    pip install ".[docs]"
    python -m sphinx -W -b html docs build/docs

The API reference is written at build time (``_write_api_pages``) from the package itself:
every public module (no leading underscore; the command-line modules aside) gets a page
listing its public names (``__all__`` where the module has one), so a new public function
or module appears without an edit here. The Markdown pages (``docs/*.md``) and the README's
sections are read by MyST; the gallery (``docs/examples/plot_*.py``) runs at build time.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import volsample

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

# Command-line modules: documented by their --help (and docs/cli.md where present).
_NOT_API = {"volsample.cli", "volsample.register", "volsample.bench", "volsample.__main__"}


def _public_modules() -> list[str]:
    """``volsample`` and its public submodules, less those whose every public name the
    package itself offers (``volsample.grid_sample`` holds ``volsample.grid_sample_3d``)."""
    names = ["volsample"]
    top = set(volsample.__all__)
    for info in pkgutil.walk_packages(volsample.__path__, "volsample."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts) or info.name in _NOT_API:
            continue
        documented, constants = _public_names(importlib.import_module(info.name))
        if set(documented) | set(constants) <= top:
            continue
        names.append(info.name)
    return names


def _public_names(module) -> tuple[list[str], list[str]]:
    """(functions and classes, constants) that ``module`` offers its users."""
    if hasattr(module, "__all__"):
        names = list(module.__all__)
    else:
        names = [n for n in vars(module) if not n.startswith("_")]
    documented, constants = [], []
    for name in names:
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj) or callable(obj):
            home = getattr(obj, "__module__", "") or ""
            # A module without __all__ offers what it defines, not what it imports.
            if hasattr(module, "__all__") or home.startswith(module.__name__):
                documented.append(name)
        elif name.isupper():
            constants.append(name)
    return documented, constants


def _module_page(name: str) -> str:
    module = importlib.import_module(name)
    documented, constants = _public_names(module)
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


def setup(app):
    # Before Sphinx looks for source files (and autosummary writes the stub pages of what
    # these pages list).
    app.connect("config-inited", _write_api_pages)


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
