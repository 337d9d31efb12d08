"""The findings catalogue lists exactly the finding codes the package can emit.

The reference is independent of the registry: the package's source is scanned with ``ast`` for every
``Finding(...)`` call (and every ``.with_(name=...)``), and each call's name argument is resolved to the
strings it can take: a literal, either branch of ``a if c else b``, a loop variable over a literal tuple
of tuples, or a module-level dict literal indexed (its values). A name the scanner cannot resolve fails
the test: a new finding code must be written so that it can be read from the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlparity.diagnose.catalogue import catalogue, catalogue_markdown, catalogue_text, lookup, thresholds
from rlparity.diagnose.findings import Severity, catalogue_anchor
from rlparity.diagnose.topic import topics

PACKAGE = Path(__file__).resolve().parent.parent / "rlparity"


class Unresolved(Exception):
    pass


def _module_dicts(tree: ast.Module) -> dict[str, ast.Dict]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value
    return out


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _resolve(expr: ast.AST, call: ast.AST, parents, dicts, where: str) -> set[str]:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        return _resolve(expr.body, call, parents, dicts, where) | _resolve(expr.orelse, call, parents, dicts, where)
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name) and expr.value.id in dicts:
        return set().union(*(_resolve(v, call, parents, dicts, where) for v in dicts[expr.value.id].values))
    if isinstance(expr, ast.Name):
        node = call
        while node in parents:  # the enclosing for loop that binds the name, over a literal tuple of tuples
            node = parents[node]
            if isinstance(node, ast.For) and isinstance(node.iter, (ast.Tuple, ast.List)):
                targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
                idx = [i for i, t in enumerate(targets) if isinstance(t, ast.Name) and t.id == expr.id]
                if idx:
                    out = set()
                    for row in node.iter.elts:
                        item = row.elts[idx[0]] if isinstance(row, (ast.Tuple, ast.List)) else row
                        out |= _resolve(item, call, parents, dicts, where)
                    return out
    raise Unresolved(f"{where}: cannot resolve the finding name {ast.unparse(expr)!r}")


def emitted_codes(package: Path = PACKAGE) -> dict[str, set[str]]:
    """``{code: {file:line, ...}}`` for every name a ``Finding(...)`` call (or ``.with_(name=...)``) in
    ``package`` can take."""
    out: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        parents, dicts = _parents(tree), _module_dicts(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            expr = None
            if fname == "Finding":
                expr = node.args[1] if len(node.args) >= 2 else next(
                    (k.value for k in node.keywords if k.arg == "name"), None)
            elif fname in ("with_", "replace"):
                expr = next((k.value for k in node.keywords if k.arg == "name"), None)
                if fname == "replace" and expr is not None and not node.args:
                    expr = None  # str.replace / settings .replace(name=...) are not findings
            if expr is None:
                continue
            where = f"{path.relative_to(package.parent)}:{node.lineno}"
            for code in _resolve(expr, node, parents, dicts, where):
                out.setdefault(code, set()).add(where)
    return out


def test_the_scanner_resolves_every_form_and_refuses_what_it_cannot_read(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        'NAMES = {"x": "from_dict_a", "y": "from_dict_b"}\n'
        "def f(s, worse):\n"
        '    out = [Finding(L, "literal_code", S, "")]\n'
        '    out.append(Finding(L, "worse_code" if worse else "better_code", S, ""))\n'
        '    for name, key in (("loop_a", 1), ("loop_b", 2)):\n'
        "        out.append(Finding(L, name, S, ''))\n"
        "    out.append(Finding(L, NAMES[s], S, ''))\n"
        "    out.append(Finding(layer=L, name='keyword_code', severity=S, summary=''))\n"
        "    return [f.with_(name='renamed_code') for f in out]\n")
    assert set(emitted_codes(pkg)) == {"literal_code", "worse_code", "better_code", "loop_a", "loop_b",
                                       "from_dict_a", "from_dict_b", "keyword_code", "renamed_code"}
    (pkg / "b.py").write_text("def g(s):\n    return Finding(L, f'{s}_differs', S, '')\n")
    with pytest.raises(Unresolved, match="b.py:2"):
        emitted_codes(pkg)


def test_the_catalogue_lists_exactly_the_codes_the_package_can_emit():
    emitted = emitted_codes()
    cat = catalogue()
    missing = sorted(set(emitted) - set(cat))
    stale = sorted(set(cat) - set(emitted))
    assert not missing, f"codes emitted but not in rlparity.diagnose.catalogue: {missing}"
    assert not stale, f"codes in the catalogue that nothing emits: {stale}"
    assert len(cat) == len(emitted) >= 61  # 61 with issue 35's stop_tokens topic


def test_topics_declare_their_codes_in_their_own_module_and_run_in_the_methods_order():
    """The topic protocol (issue 35): every code is declared by the topic module that emits it, the
    topics run backend first (semantic < inference path < objective), and a clash is refused."""
    from dataclasses import replace

    from rlparity.diagnose import topic as topic_mod
    from rlparity.diagnose.findings import Layer

    ts = topics()
    names = [t.name for t in ts]
    assert names[:4] == ["semantic", "temperature", "processing", "stop_tokens"] and names[-1] == "objective"
    assert "layers" in names and names.index("head_precision") < names.index("layers")  # layers reads the head's fixes
    rank = {Layer.SEMANTIC: 0, Layer.INFERENCE_PATH: 1, Layer.OBJECTIVE: 2}
    layer_of = [max(rank[c.layer] for c in t.codes) for t in ts]
    assert layer_of == sorted(layer_of), list(zip(names, layer_of))
    for t in ts:
        assert all(c.module == f"rlparity.diagnose.{t.name}" for c in t.codes), t.name
    # a second topic with an order or a code already taken is refused with a message naming it
    import importlib
    import types

    fake = types.ModuleType("rlparity.diagnose._fake_topic")
    fake.TOPIC = replace(ts[0], name="_fake_topic", order=ts[0].order)
    real_import = importlib.import_module

    def patched(name, *a, **k):
        return fake if name.endswith("._fake_topic") else real_import(name, *a, **k)

    import pkgutil
    real_iter = pkgutil.iter_modules
    try:
        topic_mod.topics.cache_clear()
        topic_mod.importlib.import_module = patched
        topic_mod.pkgutil.iter_modules = lambda path: [*real_iter(path), pkgutil.ModuleInfo(None, "_fake_topic", False)]
        with pytest.raises(ValueError, match="share an order"):
            topic_mod.topics()
        fake.TOPIC = replace(ts[0], name="_fake_topic", order=999)
        topic_mod.topics.cache_clear()
        with pytest.raises(ValueError, match="declared by two topics") as err:
            topic_mod.topics()
        # the message names the codes declared twice (the copied topic's), not every code
        assert "'raw_logprobs_used_as_processed'" in str(err.value) and "'stop_tokens_consistent'" not in str(err.value)
    finally:
        topic_mod.importlib.import_module = real_import
        topic_mod.pkgutil.iter_modules = real_iter
        topic_mod.topics.cache_clear()
    assert [t.name for t in topic_mod.topics()] == names


def test_every_entry_says_what_it_means_how_it_is_decided_and_how_to_fix_it():
    emitted = emitted_codes()
    for code, c in catalogue().items():
        assert len(c.meaning) > 40 and c.meaning.endswith("."), code
        assert len(c.fix) > 15, code
        assert c.severities and all(isinstance(s, Severity) for s in c.severities), code
        assert c.calibrated_on, code
        assert c.module.startswith("rlparity.diagnose."), code
        # the module the entry names is where the code is emitted
        assert any(w.startswith(c.module.replace(".", "/") + ".py") for w in emitted[code]), (code, emitted[code])
        for t in thresholds(c):  # every threshold resolves to a value in the code
            assert t["value"] is not None, (code, t)
    from rlparity.diagnose.causes import CAUSES

    assert {k for c in catalogue().values() for k in c.causes} <= set(CAUSES)


def test_an_emitted_finding_agrees_with_its_entry_and_links_to_its_anchor():
    from rlparity.diagnose import diagnose
    from rlparity.testing import synthetic_trace

    report = diagnose({"raw": synthetic_trace(logprobs_mode="raw_logprobs", arm="raw"),
                       "ok": synthetic_trace(arm="ok")})
    assert report.names() and "raw_logprobs_used_as_processed" in report.names()
    for f in report:
        entry = lookup(f.name)
        # the check's own severities; the attribution may demote a verdict another cause explains to information
        assert f.layer == entry.layer, f.name
        assert f.severity in entry.severities or (f.explained_by and f.severity == Severity.INFO), (f.name, f.severity)
        assert f.cause is None or f.cause in entry.causes, (f.name, f.cause)
    html = report._repr_html_()
    assert "../reference/findings.html#finding-raw-logprobs-used-as-processed" in html
    assert catalogue_anchor("kv_carried_over_update") == "finding-kv-carried-over-update"


def test_the_page_and_the_terminal_text_hold_every_code_with_its_anchor():
    md = catalogue_markdown()
    for code, c in catalogue().items():
        assert f"({c.anchor})=\n### `{code}`" in md, code
        assert f"](#{c.anchor})" in md
    assert f"{len(catalogue())} codes" in md
    one = catalogue_text("stale_prefix_cache_after_update")
    assert "defaults().stale_ratio = 3" in one and "reset the prefix cache" in one
    assert len(catalogue_text().splitlines()) == len(catalogue())
    with pytest.raises(KeyError, match="did you mean stale_prefix_cache_after_update"):
        lookup("stale_prefix_cache_after_updat")


def test_the_backend_ratio_entry_points_to_the_live_recorders_multi_step_alarm():
    """The one-step check's entry names its multi-step form, the live recorder's ``ratio_offset``
    alarm, and the window setting it pools over; both exist (a rename would leave a stale pointer)."""
    from rlparity.config.defaults import defaults
    from rlparity.record.live import ALARMS

    c = lookup("backend_ratio_not_centred")
    assert "`ratio_offset`" in c.meaning and "rlparity.record.live" in c.meaning
    assert "ratio_offset" in ALARMS and "`record.ratio_window`" in c.meaning
    assert defaults().record.ratio_window >= 1
    assert "`ratio_offset` alarm (rlparity.record.live)" in catalogue_markdown()
    assert "ratio_offset" in catalogue_text("backend_ratio_not_centred")


def test_thresholds_are_read_from_the_defaults_in_effect():
    from rlparity.config import defaults_context

    c = lookup("ess_collapse")
    assert {t["where"]: t["value"] for t in thresholds(c)}["defaults().objective.ess_min"] == 0.3
    with defaults_context(objective={"ess_min": 0.25}):
        assert {t["where"]: t["value"] for t in thresholds(c)}["defaults().objective.ess_min"] == 0.25


def test_check_forbids_only_catalogued_codes():
    from rlparity.config.defaults import CheckThresholds

    assert set(CheckThresholds().forbid_findings) <= set(catalogue())



def test_cli_lists_the_catalogue_and_refuses_an_unknown_code(cli):
    import json

    listing = cli("findings")
    assert listing.exit_code == 0 and len(listing.stdout.strip().splitlines()) == len(catalogue())
    one = cli("findings", "setting_no_effect", "--json")
    assert one.exit_code == 0 and json.loads(one.stdout)["code"] == "setting_no_effect"
    bad = cli("findings", "setting_no_efect")
    assert bad.exit_code == 2 and "did you mean setting_no_effect" in bad.stderr and "Traceback" not in bad.output
