"""A report renders compactly in a notebook: one row per problem with its fix at full width, the
arms without problems and the information findings collapsed into counts, values formatted (no
numpy or dict reprs, long lists cut), every code linked to the findings catalogue."""

from __future__ import annotations

import re

import numpy as np

from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.report import Report

STALE_FIX = "reset the prefix cache whenever the weights change"


def _report() -> Report:
    fs = []
    for arm in ("a", "b", "c"):  # the same problem and fix on three arms
        fs.append(Finding(Layer.INFERENCE_PATH, "stale_prefix_cache_after_update", Severity.ERROR,
                          f"arm {arm} hit a stale cache", {"sequences": list(range(40)), "ratio": np.float64(6.17)},
                          STALE_FIX, arm, cause="stale_prefix_cache", share=0.8,
                          tokens={"scope": "stale", "n_tokens": 10, "n_sequences": 2}))
    fs.append(Finding(Layer.INFERENCE_PATH, "kv_carried_over_update", Severity.WARNING, "carried over",
                      {"arms": [np.str_("a"), np.str_("b")]}, "update with clear_cache=True", "a"))
    for arm in ("a", "b", "c", "d", "e"):
        fs.append(Finding(Layer.SEMANTIC, "logprobs_processed", Severity.INFO, "processed", {"alpha": 1.0}, "", arm))
    fs.append(Finding(Layer.OBJECTIVE, "ess_collapse", Severity.INFO, "low ESS [explained by stale_prefix_cache]",
                      {}, "fix the backend first", "a", explained_by="stale_prefix_cache"))
    return Report(fs, title="inflight")


def _table(html: str) -> str:
    return html.split("<details>", 1)[0]


def test_one_row_per_problem_with_its_fix_once_at_full_width():
    r = _report()
    html = r._repr_html_()
    table = _table(html)
    assert table.count(STALE_FIX) == 1  # three arms, one row, the fix once
    assert table.count("colspan='2'><b>fix:</b>") == 2  # one fix row per problem
    rows = re.findall(r"<tr><td style='color:[^']+;font-weight:bold'>(\w+)</td>", table)
    assert rows == ["error", "warning"]  # the layer order: inference path before the objective; worst first
    groups = r.groups()
    assert [g["arms"] for g in groups] == [["a", "b", "c"], ["a"]]
    assert "a, b, c" in re.sub(r" &#9733;", "", table)


def test_ok_arms_and_information_are_collapsed_into_counts():
    r = _report()
    table = _table(r._repr_html_())
    assert r.ok_arms() == ["d", "e"] and "(2 arms, no problem): d, e" in table
    assert r.info_counts() == {"logprobs_processed": 5}
    assert "5 information findings" in table and "&times;5" in table
    assert r.explained_counts() == {("ess_collapse", "stale_prefix_cache"): 1}
    assert "1 verdict another cause explains" in table
    # the information findings are no rows of the table
    assert "processed</small>" not in table


def test_values_are_formatted_not_repr():
    html = _report()._repr_html_()
    assert "np.float64" not in html and "np.str_" not in html and "{" not in re.sub(r"<[^>]+>", "", html)
    assert "6.17" in html and "[a, b]" in html
    assert "... (32 more)" in html  # 40 sequence indices cut after 8
    text = str(_report())
    assert "np.str_" not in text and "... (32 more)" in text


def test_codes_link_to_the_catalogue_or_not():
    r = _report()
    html = r.to_html()
    assert "href='../reference/findings.html#finding-stale-prefix-cache-after-update'" in html
    assert "#finding-logprobs-processed" in html  # the collapsed codes link too
    other = r.to_html(catalogue="https://example.org/findings.html", evidence=False)
    assert "https://example.org/findings.html#finding-kv-carried-over-update" in other and "<details>" not in other
    assert "href=" not in r.to_html(catalogue=None)


def test_a_finding_renders_compactly_alone():
    f = _report().findings[0]
    html = f._repr_html_()
    assert "<b>fix:</b> " + STALE_FIX in html and "<details><summary>evidence</summary>" in html
    assert "explains 80% of the excess mismatch" in html


def test_a_clean_report_says_so_without_a_table():
    r = Report([Finding(Layer.SEMANTIC, "logprobs_processed", Severity.INFO, "processed", {}, "", "x")])
    html = r._repr_html_()
    assert "parity: no problem found" in html and "<thead>" not in html and "(1 arm, no problem): x" in html
