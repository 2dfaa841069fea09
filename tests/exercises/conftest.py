"""The exercise tests never touch the user's files: the CLI's memory of the hints read goes to a
temporary folder, and the hints read in this process are forgotten between tests."""
import pytest


@pytest.fixture(autouse=True)
def _fresh_hint_memory(tmp_path, monkeypatch):
    from attention_ref.exercises import checker

    monkeypatch.setenv("ATTENTION_REF_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(checker, "_HINTS_READ", {})
