"""The repository documents itself: docs/ is complete, generated where it can be, and
nothing points outside the repository."""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest
from pydantic import BaseModel

from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_path
from firstfault.schemas import diagnosis as dschema
from firstfault.schemas.events import Ref

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TEXT_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".toml", ".sh", ".html")
# An absolute path on a build machine: a "work" or "tmp" folder at the root, standing on its own
# (not the tail of another path, as in ".../pytorch_1518244421288/work/torch/..." of a real log line).
ABSOLUTE = re.compile(r"(?<![\w.~/-])/(?:work|tmp)/")
# Test data may name a scratch path under the root "tmp" (a run file's log_file, say), never "work".
TEST_DATA = ("tests/",)
TMP = "/" + "tmp/"                      # spelled in pieces, so this file passes its own check


def _load_generator(name: str = "gen_taxonomy_doc"):
    """A script of scripts/ as a module (they are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _repo_text_files() -> list[str]:
    """Tracked files, and new ones not ignored (a file about to be committed is checked too)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.splitlines() if p.endswith(TEXT_SUFFIXES) and (ROOT / p).is_file())


# ---------------------------------------------------------------- taxonomy

def test_taxonomy_doc_is_the_generated_page():
    gen = _load_generator()
    assert (DOCS / "taxonomy.md").read_text(encoding="utf-8") == gen.render(), \
        "docs/taxonomy.md is stale: run python scripts/gen_taxonomy_doc.py"


def test_taxonomy_doc_has_a_row_for_every_sub_domain_the_engine_knows():
    text = (DOCS / "taxonomy.md").read_text(encoding="utf-8")
    taxonomy = load_catalog().taxonomy
    for domain, subs in taxonomy.items():
        assert f"### `{domain}`" in text
        for sub, row in subs.items():
            assert re.search(rf"^\| `{re.escape(sub)}` \|.*\| `{row['recovery']}` \|", text, re.M), (domain, sub)


def test_taxonomy_generator_refuses_a_sub_domain_it_has_no_text_for(tmp_path):
    gen = _load_generator()
    tax = tmp_path / "taxonomy.yaml"
    tax.write_text("domains:\n  gpu:\n    brand_new: {recovery: retry, summary: x, next_step: y}\n")
    with pytest.raises(SystemExit, match="gpu/brand_new"):
        gen.render(tax)


# ---------------------------------------------------------------- nothing points outside the repository

def test_no_file_names_an_absolute_path_on_a_build_machine():
    found = []
    for rel in _repo_text_files():
        text = (ROOT / rel).read_text(encoding="utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            for m in ABSOLUTE.finditer(line):
                if m.group(0) == TMP and rel.startswith(TEST_DATA):
                    continue
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not found, "absolute paths outside the repository:\n" + "\n".join(found)


def test_the_absolute_path_check_tells_a_path_from_a_path_tail():
    assert ABSOLUTE.search("see " + "/" + "work/shared/contract.md")
    assert ABSOLUTE.search("(`" + TMP + "s`)")
    assert not ABSOLUTE.search("file=/opt/conda/conda-bld/pytorch_1518244421288/work/torch/lib/THC")
    assert not ABSOLUTE.search("C:/cb/pytorch_1000000000000/work/aten/src")


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def _links(path: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", path.read_text(encoding="utf-8")))


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "samples" / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page):
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):       # http:, https:, mailto:
            continue
        where, _, anchor = unquote(target).partition("#")
        dest = (page.parent / where).resolve() if where else page
        if where.startswith("/") or not dest.is_relative_to(ROOT) or not dest.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [bad](missing.md) [skip](https://example.org)\n```\n[code](nope.md)\n```\n")
    assert _links(page) == ["#top", "missing.md", "https://example.org"]
    assert _anchors(page) == {"top"}
    assert _slug("`state` and `terminal_state`") == "state-and-terminal_state"
    assert _slug("No `workload.json`: a bare file or a folder in any layout") == \
        "no-workloadjson-a-bare-file-or-a-folder-in-any-layout"


def test_readme_lists_the_four_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Documentation", 1)[1]
    for name in ("bundle", "diagnosis", "taxonomy", "commands"):
        assert f"(docs/{name}.md)" in section


# ---------------------------------------------------------------- the diagnosis fields

def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_diagnosis_doc_names_every_field_of_the_schema():
    text = (DOCS / "diagnosis.md").read_text(encoding="utf-8")
    models = [dschema.Diagnosis, dschema.RootCause, dschema.Symptom, dschema.EvidenceStep, dschema.ExplainsEdge,
              dschema.Candidate, dschema.MissingEvidence, dschema.Recovery, Ref]
    missing = sorted(f"{m.__name__}.{f}" for m in models for f in _fields(m) if f"`{f}`" not in text)
    assert not missing, f"docs/diagnosis.md does not describe: {missing}"
    for section in ("`recovery`", "`root_cause`", "`candidates`", "`symptoms`", "`explains`",
                    "`symptom_coverage`", "`evidence`", "`missing_evidence`"):
        assert re.search(rf"^### {re.escape(section)}", text, re.M), section


def _example(text: str) -> dict:
    block = text.split("## Example", 1)[1]
    return json.loads(block.split("```json\n", 1)[1].split("\n```", 1)[0])


def test_diagnosis_example_is_what_analyze_prints_for_the_worked_example():
    shown = _example((DOCS / "diagnosis.md").read_text(encoding="utf-8"))
    real = analyze_path(ROOT / "samples" / "worked-example").diagnosis.to_dict()
    assert set(shown) == set(real)
    # What the sample is about does not move with catalog edits; rules_version and counts may.
    for key in ("workload_id", "attempt", "terminal_state", "status", "domain", "sub_domain", "responsible_nodes",
                "suspect_nodes", "candidates", "missing_evidence"):
        assert shown[key] == real[key], key
    assert set(shown["root_cause"]) == set(real["root_cause"])
    for key in ("kind", "host", "gpu", "rank", "ref", "text", "timestamp"):
        assert shown["root_cause"][key] == real["root_cause"][key], key
    assert shown["recovery"]["action"] == real["recovery"]["action"]
    assert shown["recovery"]["nodes"] == real["recovery"]["nodes"]
    for key in ("evidence", "symptoms", "explains"):     # cut to their first entries in the page
        assert 0 < len(shown[key]) <= len(real[key])
        assert all(set(e) == set(real[key][0]) for e in shown[key]), key


# ---------------------------------------------------------------- the commands

def _commands() -> dict[str, argparse.ArgumentParser]:
    from firstfault.cli import build_parser
    from firstfault.connectors.api.serve import build_parser as serve_parser

    def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        acts = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(acts[0].choices) if acts else {}

    out: dict[str, argparse.ArgumentParser] = {}
    for name, sub in subparsers(build_parser()).items():
        inner = subparsers(sub)
        if inner:
            out.update({f"{name} {n}": p for n, p in inner.items()})
        else:
            out[name] = sub
    out["serve"] = serve_parser()                   # `serve` parses its own flags
    return out


def test_commands_doc_covers_every_command_and_option():
    text = (DOCS / "commands.md").read_text(encoding="utf-8")
    missing = []
    for name, parser in sorted(_commands().items()):
        head = name.split()[0]
        if not re.search(rf"^## `firstfault {head}`", text, re.M):
            missing.append(f"a section for firstfault {head}")
        section = text.split(f"## `firstfault {head}`", 1)[-1].split("\n## ", 1)[0]
        for action in parser._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt != "--help" and not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", section):
                    missing.append(f"firstfault {name} {opt}")
    assert not missing, "docs/commands.md is stale (see firstfault COMMAND --help): " + ", ".join(missing)


# ---------------------------------------------------------------- coverage of the emitters' messages

def _load_coverage():
    return _load_generator("gen_coverage_doc")


def test_coverage_doc_is_the_generated_page():
    assert (DOCS / "coverage.md").read_text(encoding="utf-8") == _load_coverage().render(), \
        "docs/coverage.md is stale: run python scripts/gen_coverage_doc.py"


def test_every_pattern_an_enumeration_names_is_in_the_catalog():
    gen = _load_coverage()
    ids = {p.id for p in load_catalog().patterns}
    emitters = gen.load_emitters()
    assert emitters, "rules/emitters/ holds no enumeration"
    dangling = sorted((em["emitter"], p) for em in emitters for s in em.get("sites") or [] for p in gen._patterns(s)
                      if p not in ids)
    assert not dangling, f"sites name patterns the catalog does not have: {dangling}"


def test_every_emitter_is_mostly_classified_and_says_why_it_leaves_sites_out():
    gen = _load_coverage()
    for em in gen.load_emitters():
        sites = em.get("sites") or []
        assert em.get("repo") and em.get("version") and sites, em["emitter"]
        classified = [s for s in sites if s.get("class") in gen.CLASSES]
        assert len(classified) >= 0.9 * len(sites), (em["emitter"], len(classified), len(sites))
        unexplained = [s.get("where") for s in classified if not gen._patterns(s) and not s.get("left_out")]
        assert not unexplained, (em["emitter"], unexplained)


def test_the_coverage_count_refuses_a_pattern_the_catalog_lacks(tmp_path):
    gen = _load_coverage()
    (tmp_path / "x.yaml").write_text("emitter: X\nrepo: a/b\nversion: v1\nsites:\n"
                                     "  - {where: a.c:1, message: m, class: root, sub_domain: null, pattern: nope.nope}\n")
    assert "| X | `a/b` v1 | 1 | 1 (100%) | 0 (0%) | 1 |" in gen.render(ids={"other"}, folder=tmp_path)
