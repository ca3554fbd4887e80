"""Files written whole or not at all: a write killed midway leaves the old file; a bench results
directory whose manifest is torn, missing or foreign refuses to resume with one clear error."""

from __future__ import annotations

import json
import os

import pytest

from relaxspec import atomic
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.results import MANIFEST, RECORDS, Cell, ResultsStore
from relaxspec.train.cards import record_metrics


class Killed(Exception):
    """Stands for a kill arriving in the middle of a write."""


def killed_after(rows: list, n: int):
    """The rows, then a kill after ``n`` of them were written."""
    for i, row in enumerate(rows):
        if i == n:
            raise Killed
        yield row


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_killed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "rows.jsonl"
    atomic.write_jsonl(path, [{"a": 1}, {"a": 2}])
    os.chmod(path, 0o600)
    with pytest.raises(Killed):
        atomic.write_jsonl(path, killed_after([{"b": i} for i in range(100)], 50))
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n' and leftovers(tmp_path) == ["rows.jsonl"]
    with pytest.raises(TypeError):  # not serialisable: nothing written
        atomic.write_json(path, {"x": object()})
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n' and leftovers(tmp_path) == ["rows.jsonl"]
    atomic.write_text(path, "new")
    assert path.read_text() == "new" and (path.stat().st_mode & 0o777) == 0o600  # keeps its mode
    with pytest.raises(Killed):  # a new file killed midway: no file at all
        atomic.write_jsonl(tmp_path / "new.jsonl", killed_after([{}, {}], 1))
    assert leftovers(tmp_path) == ["rows.jsonl"]


def test_a_killed_manifest_save_leaves_the_old_manifest(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path)
    store.start_session("relaxspec bench --methods sd")
    before = (tmp_path / MANIFEST).read_text()

    def dump_then_die(obj, **kw):
        raise Killed

    monkeypatch.setattr(atomic.json, "dumps", dump_then_die)
    with pytest.raises(Killed):
        store.start_session("relaxspec bench --methods nsd")
    monkeypatch.undo()
    assert (tmp_path / MANIFEST).read_text() == before and leftovers(tmp_path) == [MANIFEST]
    assert len(ResultsStore(tmp_path).manifest["sessions"]) == 1


def test_a_kill_during_the_write_itself_leaves_the_old_manifest(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path)
    store.start_session("first")
    before = (tmp_path / MANIFEST).read_text()
    real_fdopen = os.fdopen

    class Torn:
        """A file object that writes half of what it is given, then dies."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            self.f.flush()
            raise Killed

    monkeypatch.setattr(atomic.os, "fdopen", lambda *a, **kw: Torn(real_fdopen(*a, **kw)))
    with pytest.raises(Killed):
        store.start_session("second")
    monkeypatch.undo()
    assert (tmp_path / MANIFEST).read_text() == before and leftovers(tmp_path) == [MANIFEST]


def _record(session: str | None) -> dict:
    cell = Cell("ar", {}, "math", 0, {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 4})
    record = {"type": "record", "cell": cell.to_dict(), "example": "a", "tokens": [1], "seconds": 1.0}
    return record | ({"session": session} if session else {})


@pytest.mark.parametrize(
    "manifest,match",
    [
        (None, "holds 1 benchmark records but no manifest.json"),
        ('{"version": 1, "models": {}, "sess', "corrupted results manifest"),  # torn
        ("", "corrupted results manifest"),
        ('{"version": 1, "models": {}, "sessions": [{"id": "other"}]}', "records of session s1 that"),
    ],
)
def test_resume_refuses_records_the_manifest_does_not_account_for(tmp_path, manifest, match):
    (tmp_path / RECORDS).write_text(json.dumps(_record("s1")) + "\n")
    if manifest is not None:
        (tmp_path / MANIFEST).write_text(manifest)
    with pytest.raises(RelaxSpecError, match=match) as err:
        ResultsStore(tmp_path)
    assert "new --out directory" in str(err.value) and len(str(err.value).splitlines()) == 1


def test_resume_accepts_a_consistent_directory(tmp_path):
    store = ResultsStore(tmp_path)
    session = store.start_session("relaxspec bench")
    store.append(_record(session))
    store.append(_record(None))  # records written before sessions were recorded
    assert len(ResultsStore(tmp_path).records) == 2


def test_model_card_records_are_written_whole_and_read_with_a_clear_error(tmp_path, monkeypatch):
    record_metrics(tmp_path, {"math_accuracy": 0.8}, ["relaxspec eval"])
    before = (tmp_path / "training.json").read_text()
    monkeypatch.setattr(atomic.json, "dumps", lambda *a, **kw: (_ for _ in ()).throw(Killed()))
    with pytest.raises(Killed):
        record_metrics(tmp_path, {"math_accuracy": 0.9})
    monkeypatch.undo()
    assert (tmp_path / "training.json").read_text() == before
    (tmp_path / "training.json").write_text('{"metrics": {"math_acc')
    with pytest.raises(RelaxSpecError, match="corrupted training record"):
        record_metrics(tmp_path, {"math_accuracy": 0.9})


def test_a_record_torn_by_a_kill_is_dropped_at_resume_and_appends_go_on(tmp_path, capsys):
    """records.jsonl is appended, not replaced: a kill can leave half a last line. The report
    skips it, a resume cuts it off (with a note) so the next record starts on a line of its own."""
    from relaxspec.eval.results import load_records

    whole = json.dumps(_record(None)) + "\n"
    (tmp_path / MANIFEST).write_text('{"version": 1, "models": {}, "sessions": []}')
    (tmp_path / RECORDS).write_text(whole + whole + whole[:25])
    assert len(load_records(tmp_path)) == 2  # e.g. `relaxspec report` while a bench appends
    store = ResultsStore(tmp_path)
    assert len(store.records) == 2 and "dropped an incomplete last record" in capsys.readouterr().err
    store.append(_record(None))
    assert (tmp_path / RECORDS).read_text() == whole * 3 and len(load_records(tmp_path)) == 3
    (tmp_path / RECORDS).write_text(whole + whole.strip())  # a whole last record without newline
    assert len(ResultsStore(tmp_path).records) == 2 and (tmp_path / RECORDS).read_text() == whole * 2
    (tmp_path / RECORDS).write_text(whole[:25] + "\n" + whole)  # torn in the middle: an error
    with pytest.raises(RelaxSpecError, match=r"corrupted results file .*line 1"):
        ResultsStore(tmp_path)
