"""The book builds offline from the executed notebooks (-W: any sphinx warning fails), every
notebook chapter shows at least one interactive plotly figure, and no page loads a script from
outside the site."""

from pathlib import Path

import pytest

from rlparity.cli.notebooks import notebook_paths

pytestmark = pytest.mark.engine


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
