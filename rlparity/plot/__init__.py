"""Plotly figures. Every function takes data (a trace, a summary, a report) and returns a
``plotly.graph_objects.Figure``; none shows it. Compute lives in rlparity.metrics/diagnose.

:func:`init_notebook` sets up a renderer whose output both Jupyter and the offline Jupyter Book
show interactively without loading anything from outside: plotly's own mime type plus an HTML
fragment without plotly.js (the book serves ``plotly.min.js`` from ``_static``).
"""

from __future__ import annotations

_RENDERER = "rlparity_html"


def init_notebook() -> str:
    """Register and select the ``plotly_mimetype+rlparity_html`` renderer; return its name."""
    import plotly.io as pio
    from plotly.io._base_renderers import HtmlRenderer

    class _BookHtml(HtmlRenderer):
        def __init__(self):
            super().__init__(connected=False, full_html=False, global_init=False)
            # include_plotlyjs=False: the book page already loads _static/plotly.min.js
            self.include_plotlyjs = False

        def to_mimebundle(self, fig_dict):
            import plotly.io as _pio

            html = _pio.to_html(fig_dict, include_plotlyjs=False, full_html=False,
                                config={"displaylogo": False})
            return {"text/html": html}

    pio.renderers[_RENDERER] = _BookHtml()
    pio.renderers.default = f"plotly_mimetype+{_RENDERER}"
    return pio.renderers.default


__all__ = ["init_notebook"]
