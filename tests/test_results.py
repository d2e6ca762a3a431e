"""Results files: what ``cutetma.results.write`` puts on disk reads back as the same document,
one line a row (the repository travels to the GPU machine; every results file counts)."""

import json

from cutetma import results


def test_write_reads_back_one_line_a_row(tmp_path):
    rows = [{"M": 256, "N": 1536, "tflops": 213.5, "config": {"tile": [64, 128]}},
            {"M": 512, "N": 1536, "tflops": 355.0, "rounds": [1.5, 2.25]}]
    path = results.write("example", rows, tmp_path, command="test", extra_meta={"note": "x"})
    text = path.read_text()
    doc = json.loads(text)
    assert doc["rows"] == rows and doc["meta"]["note"] == "x" and doc["meta"]["command"] == "test"
    lines = [line.rstrip(",") for line in text.splitlines()]
    for row in rows:  # each row whole on its own line
        assert json.dumps(row, separators=(",", ":")) in lines


def test_dumps_keeps_any_document():
    for doc in ({"meta": {}, "rows": []}, {"rows": 3}, {"meta": {"a": [1, {"b": 2}]}}, {}):
        assert json.loads(results.dumps(doc)) == doc


def test_repository_results_are_written_compactly():
    """Every results file in the repository is in ``dumps``'s form (a file written by hand or
    by ``json.dump`` with an indent would take several times the room)."""
    from pathlib import Path

    files = sorted((Path(__file__).parents[1] / "benchmarks" / "results").glob("*.json"))
    assert files
    for path in files:
        text = path.read_text()
        assert results.dumps(json.loads(text)) == text, path.name
