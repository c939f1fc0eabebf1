"""Question answering on real data: does a context composed from precompiled passages keep the answer?

    .venv/bin/python bench/bench_qa.py --data bench/data/musique_dev.json --limit 20 \
        [--passages 10] [--model smollm2-135m] [--json] [--out docs/benchmarks.md]

MuSiQue in CacheBlend's protocol (`bench/data/README.md`): a fixed instruction, then the passages,
each `"{title}\\n\\n{text}\\n\\n"`, then the query
`"\\n\\nAnswer the question directly … \\nQuestion:{q}\\nAnswer:"` (the question lower-cased at its
first letter and ending in "?"), inside the model's chat turn.
Greedy, at most 32 new tokens, first line only; token F1 after SQuAD normalisation, best over the
gold answers.

Each passage is compiled once as a skill (its notes prefilled on their own, after the start token),
outside the timings; so is the instruction. `Engine.compose` then builds the context from them in
order and runs every strategy against a full prefill of the same tokens (`worker.engine.blend`):
recompute, splice (full reuse), seam (splice + the first K = 4 tokens of every passage), selective
(15%, CacheBlend's rule: ranked by first-layer K/V deviation), epic (the first k = 16 tokens of every
passage) and prefix_reuse (exact: the instruction and the first passage reused as a prefix cache
holds them). Per strategy: F1 against the gold answers, F1 against recompute's answer, first-token
agreement, median KL of the first answer token, median TTFT speed-up, with 95% bootstrap intervals
over the examples. `--json` prints `{"examples": n, "strategies": {name: {...}}}` (see qa_stats).
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
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
os.environ.setdefault("KVNOTES_DATA", str(ROOT / "var" / "test-data"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench_engine.py: shared CPUs, before torch loads

import torch  # noqa: E402
from blocks import write_block  # noqa: E402
from qa_data import DataError, Example, load_examples  # noqa: E402
from qa_stats import first_line, gold_f1, summarize  # noqa: E402

from worker.engine import Question, load  # noqa: E402

PREFIX_PROMPT = ("You will be asked a question after reading several passages. Please directly answer the "
                 "question based on the given passages. Do NOT repeat the question. The answer should be "
                 "within 5 words..\nPassages:\n")
QUERY_PROMPT = ("\n\nAnswer the question directly based on the given passages. Do NOT repeat the question. "
                "The answer should be within 5 words. \nQuestion:")
STRATEGIES = ("splice", "seam", "selective", "epic", "prefix_reuse")
LABELS = {"recompute": "recompute (full prefill)", "splice": "splice (full reuse)",
          "seam": "splice + seam K = 4", "selective": "selective 15% (CacheBlend)",
          "epic": "EPIC-style, first 16 of every passage",
          "prefix_reuse": "prefix_reuse (first passage exact)"}


def run_example(eng, example: Example) -> tuple[dict[str, dict[str, float]], dict]:
    """Per strategy: the example's scores; and what was answered (for the log)."""
    context = eng.prefill(PREFIX_PROMPT)
    skills = [eng.compile_skill(p) for p in example.passages]
    report = eng.compose(context, skills, Question(example.question, max_new_tokens=32),
                         strategies=STRATEGIES, suffix=f"{QUERY_PROMPT}{example.question}\nAnswer:")
    rec = report.strategies["recompute"]
    scores, answers = {}, {}
    for name, r in report.strategies.items():
        answer = first_line(r.decision)
        scores[name] = {"f1_gold": gold_f1(answer, example.answers), "f1_vs_recompute": r.answer_f1,
                        "first_token_agrees": float(r.top1_agrees), "kl": r.kl_to_recompute,
                        "ttft_speedup": rec.ttft_ms / r.ttft_ms}
        answers[name] = {"answer": answer, "ttft_ms": round(r.ttft_ms, 1),
                         "tokens_computed": r.tokens_computed}
    return scores, {"question": example.question, "gold": list(example.answers),
                    "prompt_tokens": report.document_tokens, "strategies": answers}


def markdown(summary: dict, meta: dict) -> str:
    rows = [f"**{summary['examples']} MuSiQue examples (from #{meta['start'] + 1} of `{meta['data']}`), "
            f"{meta['passages']} passages each (median {meta['median_tokens']} prompt tokens)**; "
            f"`{meta['model']}`; 95% bootstrap intervals over examples in brackets.\n",
            "| strategy | F1 vs gold (mean) | F1 vs recompute (mean) | first token agrees | KL of the first "
            "answer token (median) | TTFT speed-up (median) |",
            "|---|---:|---:|---:|---:|---:|"]

    def cell(row: dict, key: str, fmt: str) -> str:
        lo, hi = row[f"{key}_ci95"]
        return f"{row[key]:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"

    for name, row in summary["strategies"].items():
        rows.append(f"| {LABELS.get(name, name)} | {cell(row, 'f1_gold', '.3f')} | "
                    f"{cell(row, 'f1_vs_recompute', '.3f')} | {cell(row, 'first_token_agrees', '.2f')} | "
                    f"{cell(row, 'kl_median', '.3g')} | {cell(row, 'ttft_speedup_median', '.2f')}× |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, type=Path,
                   help="MuSiQue examples: CacheBlend's JSON list, or MuSiQue's own JSON lines (see qa_data)")
    p.add_argument("--limit", type=int, default=20, help="how many examples")
    p.add_argument("--start", type=int, default=0, help="skip the file's first N examples")
    p.add_argument("--passages", type=int, default=10,
                   help="passages per example (CacheBlend's 10; MuSiQue's own files have 20, "
                        "its supporting ones are kept; 0 = all)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--json", action="store_true", help="print only the summary as JSON")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (CPU)")
    p.add_argument("--details", type=Path, default=None, help="write each example's answers as JSON lines")
    p.add_argument("--out", type=Path, default=None, help="markdown file to write the table block into")
    p.add_argument("--block", default="qa",
                   help="the block's name in --out (between <!-- bench:NAME:begin/end -->)")
    args = p.parse_args(argv)
    if not args.data.exists():
        print(f"bench_qa: no data file {args.data}", file=sys.stderr)
        return 2
    try:
        examples = load_examples(args.data, args.limit, args.passages, args.start)
    except DataError as exc:
        print(f"bench_qa: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    from data.settings import get_settings

    eng = load(args.model, data_dir=get_settings().data_dir)
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    records, tokens, t_start = [], [], time.time()
    details = args.details.open("w", encoding="utf-8") if args.details else None
    for i, example in enumerate(examples):
        scores, seen = run_example(eng, example)
        records.append(scores)
        tokens.append(seen["prompt_tokens"])
        if details:
            details.write(json.dumps(seen) + "\n")
            details.flush()
        answers = "; ".join(f"{n}: {a['answer']!r} ({scores[n]['ttft_speedup']:.1f}×)"
                            for n, a in seen["strategies"].items())
        log(f"[{i + 1}/{len(examples)}] {seen['prompt_tokens']} tokens; gold {example.answers[0]!r}; "
            + answers)
    if details:
        details.close()
    summary = summarize(records)
    if args.json:
        print(json.dumps(summary))
        return 0
    meta = {"passages": args.passages or "all", "start": args.start, "data": args.data.name,
            "median_tokens": int(statistics.median(tokens)) if tokens else 0, "model": args.model}
    body = markdown(summary, meta)
    hw = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch threads {torch.get_num_threads()}")
    command = " ".join(argv if argv is not None else sys.argv[1:])
    body += (f"\n- command: `.venv/bin/python bench/bench_qa.py {command}`"
             f"\n- machine: {hw} (shared with other work while measuring); "
             f"{time.strftime('%Y-%m-%d %H:%M %Z')}; wall time {time.time() - t_start:.0f} s\n")
    print(body)
    if args.out:
        write_block(args.out, args.block, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
