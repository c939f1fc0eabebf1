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
