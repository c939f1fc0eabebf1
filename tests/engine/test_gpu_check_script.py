"""`scripts/gpu-check.sh --device cpu --quick` end to end (slow: a few minutes on 2 cores): every part
of the GPU script runs on the CPU at small sizes and writes its block into a temporary docs file,
leaving the prose around it alone."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_end_to_end_on_the_cpu(tmp_path, data_dir):
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nHand-written prose that must survive.\n")
    env = {**os.environ, "KVNOTES_DATA": str(data_dir)}
    done = subprocess.run([str(REPO / "scripts" / "gpu-check.sh"), "--device", "cpu", "--quick",
                           "--out", str(docs)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\nHand-written prose that must survive.\n")
    block = re.search(r"<!-- bench:gpu-check-cpu:begin -->(.*)<!-- bench:gpu-check-cpu:end -->", text, re.S)
    assert block, text[-2000:]
    body = block.group(1)
    assert "every check passed" in body
    checks = re.findall(r"^\| (tiny-[\w-]+) \| (.+?) \| .+ \| (yes|\*\*no\*\*) \|$", body, re.M)
    assert {family for family, _, _ in checks} == {"tiny-llama", "tiny-gemma3", "tiny-gpt2"}
    assert len(checks) >= 13 and all(ok == "yes" for _, _, ok in checks)
    bf16 = re.findall(r"^\| smollm2-135m \| (edit|compose) \| bfloat16 \| cpu \| "
                      r"(\w+) \| .+ \| ([\d.e+-]+) \| (yes|no) \|$", body, re.M)
    assert {"edit", "compose"} <= {run for run, _, _, _ in bf16}
    assert [float(kl) for run, name, kl, _ in bf16 if name == "prefix_reuse"][0] <= 1e-2  # the script's bound
    assert "Speed-up over recompute by field position" in body  # the edit benchmark
    compose = re.search(r"^\| ([\d,]+) \| 2 × 256 \| ([\d,]+) \| ([\d,]+) \| ([\d.]+)× \|", body, re.M)
    assert compose, body[-3000:]
    assert float(compose.group(4)) > 1.0  # splicing precompiled skills beats recomputing them
