"""Plotly figures. Every function takes data (a trace, a summary, a report) and returns a
``plotly.graph_objects.Figure``; none shows it. Compute lives in rlparity.metrics/diagnose.

:func:`init_notebook` sets up a renderer whose output both Jupyter and the offline Jupyter Book
show interactively without loading anything from outside: plotly's own mime type plus an HTML
fragment without plotly.js (the book serves ``plotly.min.js`` from ``_static``).
"""

from __future__ import annotations

_RENDERER = "rlparity_html"


def init_notebook(*, engine_logs: bool = False) -> str:
    """Set a notebook up for rlparity; return the plotly renderer's name.

    * Registers and selects the ``rlparity_html`` renderer: plotly's own mime type (Jupyter) plus
      an HTML fragment (the offline book), both of the figure after the book's layout rules
      (:func:`rlparity.plot.layout.book_layout`: responsive width, no SI prefixes, titles that fit).
    * Sends the engines' log lines to a file (:func:`rlparity.config.logs.engine_logs_to_file`,
      ``$RLPARITY_CACHE/logs``, made when an engine starts) unless ``engine_logs``, so the notebook
      shows prose, tables, figures and findings; call it before anything imports vLLM.
    * Silences tqdm's "IProgress not found" warning (no ipywidgets needed), and Python's
      deprecation and future warnings.

    Parameters
    ----------
    engine_logs : bool, default False
        Also show the engines' log lines in the notebook (they still go to the log file).

    Returns
    -------
    str
        The name of the default plotly renderer now selected (``"rlparity_html"``).
    """
    import warnings

    from rlparity.config.logs import default_log_dir, engine_logs_to_file

    engine_logs_to_file(default_log_dir(), show=engine_logs)
    try:
        from tqdm import TqdmWarning

        warnings.filterwarnings("ignore", category=TqdmWarning)
    except ImportError:  # pragma: no cover
        pass
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    import plotly.io as pio
    from plotly.io._base_renderers import HtmlRenderer

    class _BookHtml(HtmlRenderer):
        def __init__(self):
            super().__init__(connected=False, full_html=False, global_init=False)
            # include_plotlyjs=False: the book page already loads _static/plotly.min.js
            self.include_plotlyjs = False

        def to_mimebundle(self, fig_dict):
            import plotly.graph_objects as go
            import plotly.io as _pio

            from rlparity.plot.layout import book_layout

            fig = book_layout(go.Figure(fig_dict))  # the book's layout rules, for every figure shown
            html = _pio.to_html(fig, include_plotlyjs=False, full_html=False,
                                config={"displaylogo": False, "responsive": True})
            return {"application/vnd.plotly.v1+json": fig.to_plotly_json(), "text/html": html}

    pio.renderers[_RENDERER] = _BookHtml()
    pio.renderers.default = _RENDERER
    return pio.renderers.default


__all__ = ["init_notebook"]
