"""Plotly figures. Every function takes data (a trace, a summary, a report) and returns a
``plotly.graph_objects.Figure``; none shows it. Compute lives in rlparity.metrics/diagnose."""
