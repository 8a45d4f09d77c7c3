"""A bench's --write-docs replaces its own section of its topic file under docs/benchmarks/ and
leaves every other section, and every other file, as it was."""

from pathlib import Path

import pytest

from bench import report


@pytest.fixture
def docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(report, "DOCS", tmp_path)
    return tmp_path


def test_a_section_is_replaced_up_to_the_next_one(docs: Path) -> None:
    (docs / "topic.md").write_text("# Topic\n\nAbout.\n\n## A\n\nold a\n\n## B: 2026-11-22\n\n"
                                   "old b\n\n### a subsection of B\n\nmore b\n\n## C\n\nnotes\n")
    (docs / "other.md").write_text("# Other\n\n## B: 2026-11-22\n\nkept\n")
    report.write_section("topic.md", "## B: 2026-11-22", "new b\n")
    assert (docs / "topic.md").read_text() == (
        "# Topic\n\nAbout.\n\n## A\n\nold a\n\n## B: 2026-11-22\n\nnew b\n\n## C\n\nnotes\n")
    assert (docs / "other.md").read_text() == "# Other\n\n## B: 2026-11-22\n\nkept\n"


def test_a_new_section_goes_at_the_end_and_a_new_file_gets_a_header(docs: Path) -> None:
    (docs / "topic.md").write_text("# Topic\n\n## A\n\na\n")
    report.write_section("topic.md", "## D", "d")
    assert (docs / "topic.md").read_text() == "# Topic\n\n## A\n\na\n\n## D\n\nd\n"
    report.write_section("new.md", "## E", "e")
    text = (docs / "new.md").read_text()
    assert text.startswith("# Benchmarks\n") and "(../BENCHMARKS.md)" in text
    assert text.endswith("\n\n## E\n\ne\n")


def test_docs_are_the_topic_folder_beside_the_summary() -> None:
    assert report.DOCS.name == "benchmarks"
    assert (report.DOCS.parent / "BENCHMARKS.md").exists()
