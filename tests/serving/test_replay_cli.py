"""`kvnotes replay` refuses bad input with status 2 and one line naming the problem, before any
request is sent (no server needed for these)."""

from __future__ import annotations

import pytest

from tests.conftest import free_port


@pytest.fixture
def document(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text("SHIPMENT\ndestination: Oslo\ncarrier: NordFreight\n")
    return str(path)


def test_bad_input_exits_2_with_one_line(document, isolated, capsys):
    from commands.cli import main

    isolated()  # no KVNOTES_VLLM_URL
    dead = f"http://127.0.0.1:{free_port()}/v1"
    ask = ("--question", "Where?", "--values", "Rome", "--document", document)
    cases = [
        ((*ask, "--field", "Oslo"), "kvnotes: --url is needed (or KVNOTES_VLLM_URL)"),
        (("--url", dead, "--question", "Q", "--values", "Rome", "--document", "/nowhere.txt",
          "--field", "Oslo"), "document file not found: /nowhere.txt"),
        (("--url", dead, *ask, "--field", "Paris"), "--field: 'Paris' is not in the document"),
        (("--url", dead, *ask, "--field", "Oslo", "--choices", "Oslo"), "--choices needs at least two"),
        (("--url", dead, *ask, "--field", "Oslo", "--rate", "0"), "rate: must be more than 0"),
        (("--url", dead, *ask, "--field", "Oslo"), f"the server at {dead[:-3]} did not answer as vLLM does"),
    ]
    for args, message in cases:
        status = main(["replay", *args])
        err = capsys.readouterr().err.strip()
        assert status == 2 and message in err and len(err.splitlines()) == 1, (args, err)


def test_bad_turns_exit_2_naming_the_line_or_the_turn(document, tmp_path, isolated, capsys):
    from commands.cli import main

    isolated()
    dead = f"http://127.0.0.1:{free_port()}/v1"
    turns = tmp_path / "turns.jsonl"
    base = ("--url", dead, "--document", document, "--question", "Where?", "--turns", str(turns))
    cases = [
        ('{"append": "a"}\nnot json\n', (), "turns.jsonl: line 2 is not JSON"),
        ('{"append": "a", "fields": {"tier": "gold"}}\n', (),
         "a turn changes 'tier', which the document does not show as 'tier: value'"),
        ('{"append": "a"}\n{"append": "b", "fields": {"destination": ""}}\n', (),
         "turn 2 sets a field to an empty value"),
        ('{"append": "a", "question": "Paid?", "choices": ["yes"]}\n', (),
         "turn 1: give at least two choices, or none for a free answer"),
        ('{"append": "a"}\n', ("--values", "Rome"), "--values is for a field edit's replay"),
        ('{"append": "a", "fields": {"destination": "Rome"}}\n', ("--field", "destination=Paris"),
         "--field destination: 'Paris' is not in the document"),
        ('{"append": "a", "fields": {"destination": "Rome"}}\n', (),
         f"the server at {dead[:-3]} did not answer as vLLM does"),
    ]
    for text, extra, message in cases:
        turns.write_text(text)
        status = main(["replay", *base, *extra])
        err = capsys.readouterr().err.strip()
        assert status == 2 and message in err and len(err.splitlines()) == 1, (text, err)
    status = main(["replay", "--url", dead, "--document", document, "--turns", str(tmp_path / "none.jsonl")])
    assert status == 2 and "turns file not found" in capsys.readouterr().err
