"""A bundled model's first use says what it is doing (issue 33 item 6): while it converts, the run's
stage and the worker's health read "converting gemma3-270m (first use): k of n tensors", told at
the first tensor, the last and every 2% between; `kvnotes models --convert` (the install) and the
worker's start convert every bundled model ahead, so health says ok only after."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, kvnotes_env


def test_the_stage_counts_tensors_and_is_told_every_2_percent() -> None:
    from worker.runtime import converting

    said: list[str] = []
    heard = converting("gemma3-270m", said.append)
    for done in range(1, 237):
        heard(done, 236)
    assert said[0] == "converting gemma3-270m (first use): 1 of 236 tensors"
    assert said[-1] == "converting gemma3-270m (first use): 236 of 236 tensors"
    assert 45 <= len(said) <= 52  # one a 2% step, not one a tensor
    assert all(len(stage) <= 64 for stage in said)  # fits the runs' stage column


def test_the_reader_of_gguf_tensors_is_counted_while_converting() -> None:
    """The GGUF reader walks its tensors through its module's `tqdm`: the conversion counts them
    there, and puts the reader's own back afterwards."""
    import transformers.modeling_gguf_pytorch_utils as gguf_reading

    from worker.engine.models import _counting_tensors

    plain, heard = gguf_reading.tqdm, []
    with _counting_tensors(lambda done, total: heard.append((done, total))):
        assert list(gguf_reading.tqdm(["a", "b", "c"], desc="Converting")) == ["a", "b", "c"]
    assert heard == [(1, 3), (2, 3), (3, 3)] and gguf_reading.tqdm is plain
    source = Path(gguf_reading.__file__).read_text()
    assert "for tensor in tqdm(reader.tensors" in source  # what the count relies on


def test_converted_models_need_nothing_more(data_dir: Path) -> None:
    from worker.engine.models import needs_conversion

    assert not needs_conversion("smollm2-135m", data_dir) and not needs_conversion("gemma3-270m", data_dir)
    assert not needs_conversion("tiny-llama", data_dir)  # built from a config
    done = subprocess.run([sys.executable, "-m", "commands.cli", "models", "--convert"], cwd=REPO,
                          env={**kvnotes_env(data_dir), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "converting" not in done.stderr, done.stderr
    assert "smollm2-135m" in done.stdout and "gemma3-270m" in done.stdout


@pytest.mark.slow
def test_a_first_conversion_reports_k_of_n_tensors(tmp_path: Path) -> None:
    """SmolLM2 converted into an empty data folder: the stages run from 1 of n to n of n tensors."""
    from worker.engine.models import CONVERTED_MARKER, ensure_converted, needs_conversion
    from worker.runtime import converting

    said: list[str] = []
    assert needs_conversion("smollm2-135m", tmp_path)
    folder = ensure_converted("smollm2-135m", tmp_path, converting("smollm2-135m", said.append))
    assert (folder / CONVERTED_MARKER).exists() and not needs_conversion("smollm2-135m", tmp_path)
    total = int(said[-1].split(" of ")[1].split()[0])
    assert total > 100 and said[0] == f"converting smollm2-135m (first use): 1 of {total} tensors"
    assert said[-1] == f"converting smollm2-135m (first use): {total} of {total} tensors"
    print(f"smollm2-135m: {total} tensors, {len(said)} stages told")
