"""The run task's reading of a snapshot into engine arguments, without a broker."""

from __future__ import annotations

import pytest

SNAPSHOT = {
    "model": "tiny-llama",
    "document": "status: active\nOnly active users may log in.\n",
    "fields": [{"start": 8, "end": 14, "old": "active", "new": "closed", "label": "status"}],
    "errata": ["[STATE UPDATE] status is now closed.\n"],
    "placements": [],
    "question": {"text": "Can the user log in?", "choices": ["yes", "no"], "cot": False},
    "strategies": ["recompute", "erratum"],
}


def test_snapshot_becomes_engine_arguments_and_the_token_limit_is_enforced(monkeypatch, tmp_path):
    monkeypatch.setenv("KVNOTES_DATA", str(tmp_path))
    from app.settings import get_settings

    get_settings.cache_clear()
    from worker.engine import EngineError, load
    from worker.tasks import _engine_inputs

    eng = load("tiny-llama")
    args = _engine_inputs(eng, SNAPSHOT)
    assert args["fields"][0].new_value == "closed" and args["question"].choices == ("yes", "no")
    assert args["errata"] == SNAPSHOT["errata"]
    n_tokens = len(SNAPSHOT["document"]) + 1  # byte tokens + the start token
    monkeypatch.setenv("KVNOTES_MAX_DOCUMENT_TOKENS", str(n_tokens - 1))
    get_settings.cache_clear()
    with pytest.raises(EngineError, match=f"the document is {n_tokens} tokens on tiny-llama; the limit is {n_tokens - 1}"):
        _engine_inputs(eng, SNAPSHOT)
    get_settings.cache_clear()
