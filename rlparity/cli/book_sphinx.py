"""A Sphinx extension of the book (``book/_config.yml`` loads it): every page includes each script
once.

Jupyter Book sets up ``sphinx_thebe`` and ``sphinx_togglebutton`` twice, so every page carried
their inline scripts twice and the browser logged ``Identifier 'THEBE_JS_URL' has already been
declared`` on every page. :func:`unique_scripts` keeps the first of identical script entries.
"""

from __future__ import annotations


def _key(script) -> tuple:
    """What the page would render: the source and the attributes (an inline script's ``body``
    among them), not the priority the two registrations gave it."""
    attributes = getattr(script, "attributes", {}) or {}
    # an inline script is registered with filename None by one extension and "" by the other
    return str(getattr(script, "filename", script) or ""), tuple(sorted((k, str(v)) for k, v in attributes.items()))


def unique_scripts(app, pagename, templatename, context, doctree) -> None:
    """``html-page-context`` hook: drop repeated entries of the page's ``script_files``."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        key = _key(script)
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

