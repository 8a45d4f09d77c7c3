"""docs/BENCHMARKS.md stays a summary a user can read: every row of its table names the command
and the date behind its figure and links a section that exists, every topic file under
docs/benchmarks/ is linked from it, every image resolves, and each bench command writes its
section into the topic file that holds it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "docs" / "BENCHMARKS.md"
TOPICS = ROOT / "docs" / "benchmarks"

_LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)")
_DATE = re.compile(r"^20\d\d-\d\d-\d\d$")
_COMMAND = re.compile(r"`(?:[A-Z_]+=\S+ )*python -m (bench\.[a-z_]+)[^`]*`")


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """The anchors of every heading in ``doc``."""
    return {anchor(line.lstrip("#")) for line in doc.read_text().splitlines()
            if line.startswith("#")}


def links(doc: Path) -> list[tuple[bool, str]]:
    """(is an image, target) of every relative link in ``doc``."""
    return [(bang == "!", target) for bang, target in _LINK.findall(doc.read_text())
            if not target.startswith(("http://", "https://"))]


def summary_rows() -> list[dict[str, str]]:
    """The summary table's rows as {column: cell}."""
    text = SUMMARY.read_text().split("## Current figures", 1)[1].split("\n## ", 1)[0]
    table = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
            for line in table[2:]]


def unresolved(doc: Path) -> list[str]:
    """The links of ``doc`` whose file, or whose heading in that file, does not exist."""
    bad = []
    for _, target in links(doc):
        path, _, fragment = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists() or (fragment and fragment not in anchors(resolved)):
            bad.append(target)
    return bad


def test_every_link_and_image_of_the_summary_and_the_topic_files_resolves() -> None:
    for doc in (SUMMARY, *sorted(TOPICS.glob("*.md"))):
        assert unresolved(doc) == [], doc.name


def test_a_link_to_a_missing_heading_is_caught(tmp_path: Path) -> None:
    (tmp_path / "topic.md").write_text("# Topic\n\n## Throughput: 2026-11-27\n")
    doc = tmp_path / "summary.md"
    doc.write_text("[ok](topic.md#throughput-2026-11-27) [gone](topic.md#throughput-2026-11-26) "
                   "![missing](plot.png)\n")
    assert unresolved(doc) == ["topic.md#throughput-2026-11-26", "plot.png"]


def test_every_topic_file_and_image_is_reached_from_the_summary() -> None:
    linked = {(SUMMARY.parent / t.partition("#")[0]).resolve() for _, t in links(SUMMARY)}
    shown = {(doc.parent / t).resolve() for doc in TOPICS.glob("*.md")
             for image, t in links(doc) if image}
    assert sorted(p.name for p in TOPICS.glob("*.md") if p.resolve() not in linked) == []
    assert sorted(p.name for p in TOPICS.glob("*.png") if p.resolve() not in shown) == []


def test_each_summary_row_names_its_command_date_and_section() -> None:
    rows = summary_rows()
    assert len(rows) >= 10
    kinds = {row["machine kind"] for row in rows}
    assert {"CPU, fast bfloat16", "AVX2-only CPU (emulated)", "GPU"} <= kinds
    for row in rows:
        what = row["what is measured"]
        assert _DATE.match(row["date"]), what
        command = _COMMAND.fullmatch(row["command"])
        assert command, what
        module = command[1].replace(".", "/") + ".py"
        assert (ROOT / module).exists(), what
        assert row["sfbus"], what
        assert row["details"].startswith("[") and "(benchmarks/" in row["details"], what


# Every bench module that writes docs, and the (file, heading) pairs it writes.
WRITERS = {
    "bench.arithmetic": [("DOC", "SECTION")],
    "bench.bus": [("DOC", "SECTION")],
    "bench.chaos": [("DOC", "SECTION")],
    "bench.learning": [("DOC", "SECTION")],
    "bench.paper_table": [("DOC", "SECTION"), ("DOC", "SECTION_GPU")],
    "bench.populations": [("DOC", "SECTION")],
    "bench.scaling": [("DOC", "SECTION")],
    "bench.soak": [("DOC", "SECTION")],
    "bench.throughput": [("DOC", "SECTION"), ("DOC_GPU", "SECTION_GPU")],
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_each_bench_writes_into_the_topic_file_that_holds_its_section(name: str) -> None:
    module = importlib.import_module(name)
    for doc, section in WRITERS[name]:
        text = (TOPICS / getattr(module, doc)).read_text()
        assert f"\n{getattr(module, section)}\n" in text


def test_learning_vs_sf_writes_each_env_into_its_topic_file() -> None:
    from bench import learning_vs_sf
    text = (TOPICS / learning_vs_sf.DOC).read_text()
    for env in learning_vs_sf.FAMILIES:
        if (TOPICS / f"{env}_vs_sf.png").exists():
            assert f"\n{learning_vs_sf.section(env)}\n" in text, env


# Where the docs and the code cite a benchmark: `docs/benchmarks/gpu.md, "Section"` and the like.
_CITATION = re.compile(r"docs/(BENCHMARKS\.md|benchmarks/\w+\.(?:md|png))(?:,? \"([^\"]{1,80})\")?")
CITING = ("README.md", "docs/*.md", "topologies/*.yaml", "bench/*.py", "sfbus/**/*.py",
          "sfbus_components/**/*.py")


def flat(text: str) -> str:
    """``text`` as one line: line breaks, indents and comment marks between words dropped."""
    return re.sub(r"\s*\n\s*(?:#+ )?\s*", " ", text)


def broken_citations(text: str) -> list[str]:
    """The citations in ``text`` of a file that does not exist, or of a section it lacks."""
    bad = []
    for path, section in _CITATION.findall(flat(text)):
        target = ROOT / "docs" / path
        if not target.is_file() or (section and section not in flat(target.read_text())):
            bad.append(f"docs/{path} {section}".strip())
    return bad


def test_every_citation_of_a_benchmark_names_a_file_and_section_that_exist() -> None:
    files = sorted({p for pattern in CITING for p in ROOT.glob(pattern)})
    assert len(files) > 20
    bad = {str(p.relative_to(ROOT)): broken_citations(p.read_text()) for p in files}
    assert {name: cites for name, cites in bad.items() if cites} == {}


def test_a_citation_of_a_moved_section_is_caught() -> None:
    assert broken_citations('(docs/BENCHMARKS.md, "Policy lag")') == [
        "docs/BENCHMARKS.md Policy lag"]
    assert broken_citations('# measured (docs/benchmarks/learning_vs_sf.md, "Policy\n  # lag")') \
        == []
    assert broken_citations("see docs/benchmarks/gone.md") == ["docs/benchmarks/gone.md"]
