"""The book builds offline from the executed notebooks (-W: any sphinx warning fails), every
notebook chapter shows at least one interactive plotly figure, and no page loads a script from
outside the site."""

from pathlib import Path

import pytest

from conftest import book_in_light_lane
from rlparity.cli.notebooks import notebook_paths

# the notebooks it builds from start engines; under scripts/test_lanes.py the engine lane executes them and the
# book is built in the lane without engines (conftest.book_in_light_lane)
pytestmark = [] if book_in_light_lane() else pytest.mark.engine


@pytest.fixture(scope="module")
def html(executed_notebook):
    from conftest import ARTIFACTS

    import typer

    from rlparity.cli import build_app
    from rlparity.cli.book import build, prepare

    for p in notebook_paths():
        executed_notebook(p.stem)
    prepare(ARTIFACTS, cli_root=typer.main.get_command(build_app()))
    return build()


def test_book_builds_with_interactive_figures_and_no_external_scripts(html):
    from rlparity.cli.book import external_scripts, plotly_figures

    assert (html / "index.html").exists() and (html / "reference" / "cli.html").exists()
    assert (html / "_static" / "plotly.min.js").stat().st_size > 1_000_000
    for p in notebook_paths():
        page = html / "notebooks" / f"{p.stem}.html"
        assert page.exists(), f"chapter {p.stem} missing from the book"
        assert plotly_figures(page) >= 1, f"{p.stem}: no interactive plotly figure in the HTML"
        assert "plotly.min.js" in page.read_text()
    assert external_scripts(html) == {}
    from rlparity.cli.book import page_problems

    # the published pages show prose, tables, figures and findings: no engine log line, no ANSI
    # escape, no machine path, no papermill-injected parameters cell
    assert page_problems(html) == {}
    for p in notebook_paths():
        page = (html / "notebooks" / f"{p.stem}.html").read_text()
        assert "injected-parameters" not in page and "out_dir = \"/" not in page
        if "rlparity-report" in page:  # a report renders as a compact verdict, evidence folded away
            assert "<details>" in page
    import re

    for p in notebook_paths():  # issue 28: results first, asserts off the page
        page = (html / "notebooks" / f"{p.stem}.html").read_text()
        assert re.search(r'<div class="[^"]*\badmonition\b[^"]*">\s*<p class="admonition-title">Results</p>', page), \
            f"{p.stem}: no results box"
        assert "What this notebook asserts" not in page, p.stem
        inputs = re.findall(r'<div class="cell_input[^"]*">(.*?)</div>\s*</div>', page, re.S)
        code = [re.sub(r"<[^>]+>", "", i) for i in inputs]
        assert not [c for c in code if re.search(r"^\s*assert ", c, re.M)], f"{p.stem}: an assert cell is on the page"
    api = (html / "reference" / "api.html").read_text()
    assert "rlparity.diagnose.diagnose" in api  # autodoc really documented the package
    from rlparity.diagnose.catalogue import catalogue

    # the findings catalogue: one anchor per code (reports link to them)
    findings = (html / "reference" / "findings.html").read_text()
    assert [c.code for c in catalogue().values() if f'id="{c.anchor}"' not in findings] == []
    import re

    anchors = set(re.findall(r'id="(finding-[a-z0-9-]+)"', findings))
    links = {m for p in notebook_paths() for m in re.findall(
        r"\.\./reference/findings\.html#(finding-[a-z0-9-]+)", (html / "notebooks" / f"{p.stem}.html").read_text())}
    assert links and links <= anchors, sorted(links - anchors)  # every report's code links to its entry


def test_toc_lists_every_notebook():
    import yaml

    toc = yaml.safe_load((Path(__file__).parent.parent / "book" / "_toc.yml").read_text())
    files = {ch["file"] for part in toc["parts"] for ch in part["chapters"]}
    assert {f"notebooks/{p.stem}" for p in notebook_paths()} <= files


# -- issue 28 item 7: the book as its readers see it ------------------------------------------------
#: the longest page a chapter may be, in screens of a 1400 x 900 viewport (measured after issue 28:
#: 3 to 14; a chapter past it has output that belongs in a file, a fold or a smaller table)
MAX_CHAPTER_SCREENS = 20
#: a reference page may be longer (the API of a subpackage: rlparity.metrics is 66), not unboundedly
MAX_REFERENCE_SCREENS = 80


def _figures(name):
    from conftest import ARTIFACTS

    import nbformat

    nb = nbformat.read(f"{ARTIFACTS}/{name}.ipynb", as_version=4)
    return [o["data"]["application/vnd.plotly.v1+json"] for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if "application/vnd.plotly.v1+json" in (o.get("data") or {})]


def test_every_figure_fits_the_column_and_keeps_its_colours(html):
    """Every figure the chapters show passes the layout rules (rlparity.plot.layout: no width over
    the column, powers of ten instead of SI prefixes, titles that fit), and a trace name (an arm, a
    profile) has one colour in every figure of the book, never one left to plotly's colour cycle."""
    from rlparity.plot.layout import layout_problems, trace_colors

    problems, colours = {}, {}
    for p in notebook_paths():
        for k, fig in enumerate(_figures(p.stem)):
            if found := layout_problems(fig):
                problems[f"{p.stem} figure {k}"] = found
            for name, c in trace_colors(fig).items():
                if c != "per point":  # a colour scale (probability scatter) names no colour of its own
                    colours.setdefault(name, set()).add(c)
    assert problems == {}
    assert {n: c for n, c in colours.items() if None in c} == {}, "traces coloured by plotly's cycle"
    assert {n: c for n, c in colours.items() if len(c) > 1} == {}, "a name with two colours"


def test_pages_show_what_ran_and_link_the_notebook_and_the_repository(html):
    import re

    for p in notebook_paths():
        page = (html / "notebooks" / f"{p.stem}.html").read_text()
        assert "rlparity-parameters" in page, f"{p.stem}: the parameters that ran are not shown"
        assert f"_sources/notebooks/{p.stem}.ipynb" in page, f"{p.stem}: no notebook download"
        assert 'href="https://github.com/rlparity/rlparity"' in page, f"{p.stem}: no repository link"
        assert page.count("const THEBE_JS_URL") <= 1
    cli = (html / "reference" / "cli.html").read_text()
    assert "``" not in re.sub(r"<[^>]+>", "", cli)  # rST literals became code, not double backticks
    assert 'id="cli-diagnose"' in cli and 'id="cli-experiment-rl"' in cli and cli.count("<table") > 20
    from rlparity.cli.book import api_modules

    for page in api_modules():
        text = (html / "reference" / "api" / f"{page}.html").read_text()
        assert "model_config" not in text, f"api/{page}: pydantic boilerplate"
    diagnose_page = (html / "reference" / "api" / "diagnose.html").read_text()
    assert 'id="rlparity.diagnose.diagnose"' in diagnose_page or "rlparity.diagnose.core.diagnose" in diagnose_page
    assert "Parameters" in diagnose_page and "Return type" in diagnose_page  # from the annotations


def test_pages_in_a_browser_have_no_console_error_no_overflow_and_a_bounded_length(html):
    """Every page in headless Chromium (1400 x 900): no console error or uncaught exception, no
    figure wider than its column, no horizontal scrolling, and a chapter no longer than
    MAX_CHAPTER_SCREENS screens."""
    from book_browser import find_chromium, read_pages

    if find_chromium() is None:
        pytest.skip("no chromium or chrome on PATH: the browser checks of the book need one (apt install chromium)")
    pages = sorted(str(p.relative_to(html)) for p in html.rglob("*.html") if "_static" not in p.parts
                   and p.name not in ("genindex.html", "search.html"))
    seen = read_pages(html, pages)
    assert {p: r["errors"] for p, r in seen.items() if r["errors"]} == {}
    assert [p for p, r in seen.items() if r["overflow"]] == []
    wide = {p: [f["width"] for f in r["figures"] if f["width"] > r["column"] or f["drawn"] > r["column"]]
            for p, r in seen.items()}
    assert {p: w for p, w in wide.items() if w} == {}
    long = {p: round(r["screens"], 1) for p, r in seen.items()
            if r["screens"] > (MAX_CHAPTER_SCREENS if p.startswith("notebooks/") else MAX_REFERENCE_SCREENS)}
    assert long == {}
    for p in notebook_paths():  # every chapter's figures were drawn
        r = seen[f"notebooks/{p.stem}.html"]
        assert r["figures"] and all(f["drawn"] > 200 for f in r["figures"]), p.stem


def test_the_catalogue_page_holds_every_code_the_package_can_emit(html):
    import re

    from test_catalogue import emitted_codes

    from rlparity.diagnose.catalogue import catalogue

    findings = (html / "reference" / "findings.html").read_text()
    anchors = set(re.findall(r'id="(finding-[a-z0-9-]+)"', findings))
    assert {c.anchor for c in catalogue().values()} <= anchors
    assert len(catalogue()) == len(emitted_codes())
