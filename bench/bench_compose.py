"""The paper's compose measurement, and float32 against bfloat16, side by side.

    .venv/bin/python bench/bench_compose.py [--model smollm2-135m] [--device cpu] [--sizes 2048,4096] \
        [--dtypes float32,bfloat16] [--repeats 3] [--quick] [--out docs/benchmarks.md] [--block compose-cpu]

Compose (the paper's shape): 2–4 skills (passages of MuSiQue, `bench/data/musique_dev.json`, else
the repository's examples) precompiled ONCE outside timing, each after its start-token sink,
then spliced after a short instruction with seam repair (`--seam` tokens per skill) and read by a
question; against recompute of the whole prompt. Time to first token, median of `--repeats`, both
sides timed in the same call by the engine; agreement: KL at the first answer token, top-1, and
whether the greedy answers are the same. The paper reports TTFT speed-ups of 3.0× at 2k, 9.8× at 8k
and 13.9× at 32k tokens on an 8B model (a GPU).

Dtypes: each dtype's prefill time and notes size per 1,000 tokens, weights in memory, and an edit
(recompute, prefix_reuse, erratum) on the same 1k-token document, in the same process.

`--out FILE` writes the tables between `<!-- bench:BLOCK:begin -->` / `<!-- bench:BLOCK:end -->`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
os.environ.setdefault("KVNOTES_DATA", str(ROOT / "var" / "test-data"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench_engine.py: spinning threads on shared cores

import torch  # noqa: E402
from blocks import write_block  # noqa: E402

from worker.engine import Field, Question, load  # noqa: E402

MUSIQUE = [ROOT / "bench" / "data" / "musique_dev.json", Path("/work/shared/data/musique_dev.json")]
PAPER_SPEEDUP = {2048: "3.0×", 8192: "9.8×", 32768: "13.9×"}
INSTRUCTION = "Answer the question directly based on the given passages, in at most 5 words.\n"


def passages() -> list[tuple[str, str]]:
    """(text, question) pairs: each MuSiQue example's passages and its question, else the examples'
    documents with a read-back question."""
    found = [path for path in MUSIQUE if path.is_file()]
    if found:
        data = json.loads(found[0].read_text(encoding="utf-8"))
        return [("".join(f"{c['title']}\n\n{c['text']}\n\n" for c in e["ctxs"]), e["question"]) for e in data]
    docs = []
    for path in sorted((ROOT / "examples").glob("*.json")):
        example = json.loads(path.read_text(encoding="utf-8"))
        docs.append((example["document"], example.get("question") or "What does the record say?"))
    return docs


def skill_texts(eng, n: int, tokens: int) -> tuple[list[str], str]:
    """`n` skills of `tokens` tokens each (cut on a token boundary) and the question of the first."""
    source = passages()
    texts = []
    for i in range(n):
        ids: list[int] = []
        j = i
        while len(ids) < tokens:
            ids += eng.encode(source[j % len(source)][0])
            j += n
        texts.append(eng.tokenizer.decode(ids[:tokens]))
    return texts, source[0][1]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def compose_row(eng, size: int, repeats: int, seam: int, max_new: int) -> str:
    n = min(4, max(2, size // 2048))
    texts, question = skill_texts(eng, n, size // n)
    skills = [eng.compile_skill(t) for t in texts]  # precompiled: outside timing
    q = Question(question, max_new_tokens=max_new)
    reports = [eng.compose(INSTRUCTION, skills, q, at=None, seam=seam) for _ in range(repeats)]
    ttft = {
        name: statistics.median(r.strategies[name].ttft_ms for r in reports)
        for name in ("recompute", "splice")
    }
    s, r = reports[0].strategies["splice"], reports[0].strategies["recompute"]
    return (
        f"| {reports[0].document_tokens:,} | {n} × {size // n:,} | "
        f"{ttft['recompute']:,.0f} | {ttft['splice']:,.0f} | {ttft['recompute'] / ttft['splice']:.1f}× | "
        f"{PAPER_SPEEDUP.get(size, '—')} | {s.kl_to_recompute:.3g} | {'yes' if s.top1_agrees else 'no'} | "
        f"{'yes' if s.decision_matches_recompute else 'no'} ({s.answer_f1:.2f}) | {s.text.strip()[:30]!r} / "
        f"{r.text.strip()[:30]!r} |"
    )


def compose_table(eng, sizes: list[int], repeats: int, seam: int, max_new: int) -> str:
    lines = [
        f"Compose on `{eng.device}` in {eng.model.dtype}, {eng.info.alias}: skills precompiled once, "
        f"spliced with seam repair ({seam} tokens per skill) after a one-line instruction; "
        f"median TTFT of {repeats}.\n",
        "| prompt tokens | skills × tokens | recompute TTFT ms | splice TTFT ms | speed-up | paper (8B, GPU) "
        "| KL | top-1 | same answer (F1) | answers (splice / recompute) |",
        "|---:|---|---:|---:|---:|---:|---:|:-:|:-:|---|",
    ]
    lines += [compose_row(eng, size, repeats, seam, max_new) for size in sizes]
    return "\n".join(lines) + "\n"


def dtype_row(model: str, device: str, dtype: str, document: str, repeats: int) -> str:
    eng = load(model, device=device, dtype=dtype)
    eng.warm_up()
    times, notes = [], None
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        notes = eng.prefill(document)
        sync(device)
        times.append((time.perf_counter() - t0) * 1000)
    per_k = 1000 / notes.n_tokens
    weights = sum(p.numel() * p.element_size() for p in eng.model.parameters())
    start = document.index("Oslo")
    report = eng.edit(
        notes,
        [Field(start, start + 4, "Madrid", "destination")],
        Question("What is the destination of the shipment?", ("Oslo", "Madrid")),
        strategies=["recompute", "prefix_reuse", "erratum"],
    )
    st = report.strategies
    return (
        f"| {dtype} | {statistics.median(times) * per_k:,.0f} | {notes.nbytes() * per_k / 2**20:.1f} | "
        f"{weights / 2**20:,.0f} | {st['recompute'].ttft_ms:,.0f} | {st['prefix_reuse'].ttft_ms:,.0f} | "
        f"{st['erratum'].ttft_ms:,.0f} | {st['prefix_reuse'].kl_to_recompute:.2g} | "
        f"{st['erratum'].kl_to_recompute:.2g} | {st['recompute'].decision} |"
    )


def dtype_table(model: str, device: str, dtypes: list[str], repeats: int) -> str:
    document = json.loads((ROOT / "examples" / "shipment-log.json").read_text(encoding="utf-8"))["document"]
    lines = [
        f"{model} on `{device}`, the 1,040-token shipment log, side by side in one process; prefill "
        f"median of {repeats}; the edit's TTFTs are the engine's medians.\n",
        "| dtype | prefill ms per 1k tokens | notes MiB per 1k tokens | weights MiB | recompute TTFT ms "
        "| prefix_reuse TTFT ms | erratum TTFT ms | prefix_reuse KL | erratum KL | decision |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [dtype_row(model, device, d, document, repeats) for d in dtypes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="compose dtype (default: the device's)")
    p.add_argument("--sizes", default="2048,4096", help="total skill tokens per prompt")
    p.add_argument("--dtypes", default="float32,bfloat16", help="dtypes compared side by side ('' to skip)")
    p.add_argument("--seam", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    p.add_argument("--out", default=None)
    p.add_argument("--block", default=None, help="block name in --out (default compose-DEVICE)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats, args.max_new_tokens = "512", 1, 3
    torch.set_num_threads(
        min(torch.get_num_threads(), 2) if args.device == "cpu" else torch.get_num_threads()
    )
    eng = load(args.model, device=args.device, dtype=args.dtype)
    eng.warm_up()
    body = (
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, device `{args.device}`, torch "
        f"{torch.__version__}, load average {os.getloadavg()[0]:.1f} at the start\n\n"
    )
    body += compose_table(
        eng, [int(s) for s in args.sizes.split(",") if s], args.repeats, args.seam, args.max_new_tokens
    )
    dtypes = [d for d in args.dtypes.split(",") if d]
    if dtypes:
        body += "\n" + dtype_table(args.model, args.device, dtypes, args.repeats)
    print(body)
    if args.out:
        write_block(Path(args.out), args.block or f"compose-{args.device.split(':')[0]}", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
