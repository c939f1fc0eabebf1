"""Benchmark of the kvnotes engine: edit strategies by document length and field position, their
floors, composition, memory, agreement with recompute.

    .venv/bin/python bench/bench_engine.py [--model smollm2-135m] [--sizes 512,1024,2048,4096] \
        [--positions top,10%,50%,90%] [--device cpu] [--repeats 3] [--out docs/benchmarks.md]

Every latency comes from the engine itself (`Engine.edit` / `Engine.compose`): each strategy is timed
in the same process, after a warm-up, from cached notes (and compiled skills) to the decision; the
old document is prefilled ONCE outside timing and each edit call is repeated `--repeats` times.
A speed-up is recompute's time over the strategy's time IN THE SAME CALL, then the median over the
calls (so a burst of load on a shared machine moves both sides of one ratio).

Documents are deterministic (`documents.py`): a record with several fields, then many lines of
policy and log text that never mention the edited value; the edited field sits in the record head
("top") or is moved to 10%, 50% or 90% of the document. The question reads the field back with two
choices. Floors (`floor.py`): each strategy's FLOPs at the measured matmul rate plus one read of
the notes at the measured read bandwidth.

`--out FILE` writes the results between `<!-- bench:DEVICE:begin -->` and `<!-- bench:DEVICE:end -->`
markers (DEVICE = cpu or cuda), so hand-written prose around them survives a re-run; a file without
the markers gets the block appended. The tables are always printed to stdout as markdown.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
os.environ.setdefault("KVNOTES_DATA", str(ROOT / "var" / "test-data"))
# OpenMP threads that spin-wait at every barrier collapse when another process holds one of the cores:
# on this shared 2-core machine a 28-token forward took 5.5 s with 2 spinning threads against 0.26 s
# with PASSIVE waiting (see docs/benchmarks.md). Must be set before torch (libgomp) is loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from agreement import run_agreement  # noqa: E402
from blocks import write_block  # noqa: E402
from documents import (  # noqa: E402
    AGREEMENT_CASES,
    CONTEXT_SEED,
    POSITIONS,
    SKILL_HEAD,
    SKILL_SEED,
    build,
    shipment,
    text_of_tokens,
)
from floor import EditShape, Machine, floor_ms, measure_machine, shape_of, strategy_flops  # noqa: E402
from plots import latency as plot_latency  # noqa: E402
from plots import speedup_by_position  # noqa: E402

from vocabulary import render_erratum  # noqa: E402
from vocabulary.prefix import common_prefix  # noqa: E402
from worker.engine import STRATEGIES, Field, Question, load  # noqa: E402
from worker.engine.edit import Editor, diff_blocks  # noqa: E402
from worker.engine.forward import extend  # noqa: E402
from worker.engine.notes import cache_from_layers  # noqa: E402
from worker.engine.offsets import apply_fields  # noqa: E402
from worker.engine.readout import _forward, _score_choices  # noqa: E402
from worker.engine.strategies.edits.erratum import erratum  # noqa: E402
from worker.engine.strategies.edits.prefix_reuse import prefix_reuse  # noqa: E402
from worker.engine.strategies.edits.recompute import recompute  # noqa: E402

FAST = ("prefix_reuse", "stale", "in_place", "erratum", "field_erratum", "selective")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def loadavg() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def run_edit(eng, doc: str, field: Field, question: Question, repeats: int):
    notes = eng.prefill(doc)  # once, outside timing
    reports = [eng.edit(notes, [field], question, strategies=list(STRATEGIES)) for _ in range(repeats)]
    return notes, reports


def median_ms(reports, name: str) -> float:
    return statistics.median(r.strategies[name].latency_ms for r in reports)


def speedups(reports) -> dict[str, float]:
    """Per strategy: the median over calls of recompute's time over its time in the same call."""
    names = reports[0].strategies
    return {
        n: statistics.median(
            r.strategies["recompute"].latency_ms / r.strategies[n].latency_ms for r in reports
        )
        for n in names
    }


def fmt_kl(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.2e}" if x < 1e-3 else f"{x:.3f}"


def edit_table(reports, position: str) -> str:
    first = reports[0]
    rec_tokens = first.strategies["recompute"].tokens_computed
    ratio = speedups(reports)
    rows = [
        f"**{first.document_tokens} document tokens, field at {position}** (recompute decision: "
        f"`{first.strategies['recompute'].decision}`; {len(reports)} calls)\n",
        "| strategy | latency ms (median) | speed-up per call | speed-up (median) | tokens computed "
        "| % of recompute | KL to recompute | top-1 | decision | matches |",
        "|---|---:|---|---:|---:|---:|---:|:-:|---|:-:|",
    ]
    for name, r in first.strategies.items():
        per_call = ", ".join(
            f"{rep.strategies['recompute'].latency_ms / rep.strategies[name].latency_ms:.1f}"
            for rep in reports
        )
        extra = f" ({r.detail})" if name == "selective" and r.detail else ""
        extra = f" (picked {r.picked})" if r.picked else extra
        kl = fmt_kl(max(x.strategies[name].kl_to_recompute for x in reports))
        top1 = "yes" if r.top1_agrees else "no"
        matches = "yes" if r.decision_matches_recompute else "**no**"
        rows.append(
            f"| {name}{extra} | {median_ms(reports, name):.1f} | {per_call} | {ratio[name]:.1f}× "
            f"| {r.tokens_computed} | {100 * r.tokens_computed / rec_tokens:.1f}% | {kl} | {top1} "
            f"| {r.decision} | {matches} |"
        )
    return "\n".join(rows) + "\n"


def speedup_table(results: dict[tuple[str, int], list], positions: list[str], sizes: list[int]) -> str:
    """Median speed-up per strategy, one row per (position, size): the field-position axis."""
    names = [n for n in STRATEGIES if n != "recompute"]
    rows = [
        "| field | document tokens | " + " | ".join(names) + " | prefix_reuse KL | selective KL |",
        "|---|---:|" + "---:|" * (len(names) + 2),
    ]
    for pos in positions:
        for size in sizes:
            reports = results.get((pos, size))
            if not reports:
                continue
            ratio = speedups(reports)
            kl = {
                n: max(r.strategies[n].kl_to_recompute for r in reports)
                for n in ("prefix_reuse", "selective")
            }
            rows.append(
                f"| {pos} | {reports[0].document_tokens} | "
                + " | ".join(f"{ratio[n]:.1f}×" for n in names)
                + f" | {fmt_kl(kl['prefix_reuse'])} | {fmt_kl(kl['selective'])} |"
            )
    return "\n".join(rows) + "\n"


def edit_shape(eng, notes, field: Field, question: Question, report) -> EditShape:
    """The token counts the floors need, from the same edit the engine ran."""
    new_ids = eng.tokenize_document(apply_fields(notes.text, [field]))[0]
    prefix = common_prefix(notes.token_ids, new_ids)
    changed = sum(b.j2 - b.j1 for b in diff_blocks(notes.token_ids, new_ids) if not b.reuse)
    choices = [
        eng.tokenizer(eng.frame.choice_text(c), add_special_tokens=False)["input_ids"]
        for c in question.choices
    ]
    erratum = eng.encode(render_erratum(field.label, notes.text[field.start : field.end], field.new_value))
    selected = report.strategies["selective"].tokens_computed - changed
    return EditShape(
        old=notes.n_tokens,
        new=len(new_ids),
        prefix=prefix,
        changed=changed,
        downstream=len(new_ids) - prefix - changed,
        erratum=len(erratum),
        question=len(eng.encode(eng.frame.suffix(question))),
        branches=sum(len(c) - 1 for c in choices),
        choices=len(choices),
        selected=selected,
    )


def floor_table(eng, machine, cases: list[tuple]) -> str:
    """Per checked case (notes, field, question, reports): each strategy's floor and how close it came."""
    shape = shape_of(eng.model)
    rows = [
        "| document tokens, field | strategy | measured ms (median) | floor ms | measured / floor "
        "| speed-up measured | speed-up its floor allows |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for notes, field, question, position, reports in cases:
        e = edit_shape(eng, notes, field, question, reports[0])
        flops = strategy_flops(shape, e)
        floors = {
            n: floor_ms(machine, f, notes.n_tokens * shape.kv_bytes_per_token) for n, f in flops.items()
        }
        ratio = speedups(reports)
        for name in ("recompute", *FAST):
            ms = median_ms(reports, name)
            rows.append(
                f"| {notes.n_tokens}, {position} | {name} | {ms:.0f} | {floors[name]:.0f} | "
                f"{ms / floors[name]:.2f} | {ratio[name]:.1f}× | {floors['recompute'] / floors[name]:.1f}× |"
            )
    return "\n".join(rows) + "\n"


@torch.inference_mode()
def breakdown(eng, notes, field: Field, question: Question, device: str, repeats: int = 3) -> str:
    """Where the time of recompute and erratum goes: the surgery, then the readout — one forward
    holding any appended (pending) erratum tokens, the question and every choice (the engine's
    fast path), against the same readout done as three separate forwards (for comparison)."""
    from vocabulary import render_erratum
    from worker.engine.readout import decide

    new_text = apply_fields(notes.text, [field])
    new_ids, new_offsets, new_segments = eng.tokenize_document(new_text)
    editor = Editor(eng.model, eng.rope, notes, new_ids, new_segments, new_offsets)
    err_ids = eng.encode(render_erratum(field.label, notes.text[field.start : field.end], field.new_value))
    suffix_ids = eng.encode(eng.frame.suffix(question))
    choice_tokens = sum(
        len(eng.tokenizer(eng.frame.choice_text(c), add_special_tokens=False)["input_ids"])
        for c in question.choices
    )
    rows = [
        "| strategy | surgery ms | one-pass readout ms (pending + question + choices) | total ms "
        "| same readout as 3 separate forwards ms | tokens (surgery + pending + question + choices) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, fn in (
        ("recompute", lambda: recompute(editor)),
        ("erratum", lambda: erratum(editor, err_ids)),
        ("prefix_reuse", lambda: prefix_reuse(editor)),
    ):
        parts = []
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            s = fn()
            sync(device)
            t1 = time.perf_counter()
            decide(
                eng.model,
                eng.tokenizer,
                eng.frame,
                cache_from_layers(s.layers, eng.model),
                suffix_ids,
                question,
                pending=s.pending,
            )
            sync(device)
            t2 = time.perf_counter()
            layers = extend(eng.model, s.layers, s.pending) if s.pending else s.layers
            cache = cache_from_layers(layers, eng.model)
            logits = _forward(eng.model, suffix_ids, cache)
            _score_choices(eng.model, eng.tokenizer, eng.frame, logits, cache, question.choices)
            sync(device)
            t3 = time.perf_counter()
            parts.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
        a, b, c = (statistics.median(p[i] for p in parts) for i in range(3))
        computed = s.tokens_computed - len(s.pending)
        rows.append(
            f"| {name} | {a:.1f} | {b:.1f} | {a + b:.1f} | {c:.1f} | "
            f"{computed} + {len(s.pending)} + {len(suffix_ids)} + {choice_tokens} "
            f"({len(question.choices)} choices) |"
        )
    return "\n".join(rows) + "\n"


def run_compose(eng, repeats: int, size: int) -> tuple[str, dict]:
    context = text_of_tokens(
        eng, "DISPATCH LOG\ncarrier: NordFreight\nwarehouse: Gdansk-2\n", CONTEXT_SEED, size, True
    )
    skill_text = text_of_tokens(eng, SKILL_HEAD, SKILL_SEED, size, False)
    ctx_notes = eng.prefill(context)  # outside timing
    skill = eng.compile_skill(skill_text)  # outside timing
    question = Question("Within how many days can a customer return unused goods?", choices=("30", "7"))
    middle = context.index("\n", len(context) // 2) + 1
    rows = [
        f"Context {ctx_notes.n_tokens} tokens (frame included), skill {skill.n_tokens - 1} tokens "
        f"(+1 sink, dropped when spliced); median of {repeats} runs.\n",
        "| placement | seam K | recompute ms | splice ms | speed-up | tokens computed (splice / recompute) "
        "| KL to recompute | top-1 | top-10 overlap | decision (splice / recompute) |",
        "|---|---:|---:|---:|---:|---|---:|:-:|---:|---|",
    ]
    summary = {}
    for where, at in (("end", None), ("middle", middle)):
        for seam in (0, 4):
            reps = [eng.compose(ctx_notes, [skill], question, at=at, seam=seam) for _ in range(repeats)]
            rec, spl = median_ms(reps, "recompute"), median_ms(reps, "splice")
            r, s = reps[0].strategies["recompute"], reps[0].strategies["splice"]
            summary[(where, seam)] = (rec, spl, s.kl_to_recompute)
            rows.append(
                f"| {where} | {seam} | {rec:.1f} | {spl:.1f} | {rec / spl:.1f}× | "
                f"{s.tokens_computed} / {r.tokens_computed} | {fmt_kl(s.kl_to_recompute)} | "
                f"{'yes' if s.top1_agrees else 'no'} | {s.topk_overlap} | {s.decision} / {r.decision} |"
            )
    return "\n".join(rows) + "\n", summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--sizes", default="512,1024,2048,4096")
    p.add_argument(
        "--positions", default=",".join(POSITIONS), help="where the field sits: top,10%%,50%%,90%%"
    )
    p.add_argument(
        "--detail-position", default="50%", help="position whose full tables and floors are printed"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (CPU)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compose-size", type=int, default=1024)
    p.add_argument(
        "--skip", default="", help="comma-separated sections to skip: edit,breakdown,compose,agreement"
    )
    p.add_argument("--out", default=None, help="markdown file to write the results block into")
    p.add_argument(
        "--block",
        default=None,
        help="the block's name in --out and the plots' suffix (default: the device kind, cpu or cuda)",
    )
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    positions = [s.strip() for s in args.positions.split(",") if s.strip()]
    skip = set(s.strip() for s in args.skip.split(",") if s.strip())
    device_kind = "cuda" if args.device.startswith("cuda") else "cpu"
    torch.set_num_threads(args.threads)

    load_before = loadavg()
    t_start = time.time()
    from data.settings import get_settings

    eng = load(args.model, device=args.device, data_dir=get_settings().data_dir)
    out: list[str] = []

    def emit(s: str = "") -> None:
        print(s, flush=True)
        out.append(s)

    hw = (
        torch.cuda.get_device_name(0)
        if device_kind == "cuda"
        else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    mlp = (eng.model.config.hidden_size, getattr(eng.model.config, "intermediate_size", 1536))
    samples = [measure_machine(*mlp)]  # re-measured after every edit case: floors use the best seen
    machine = samples[0]
    emit(f"### Run ({device_kind})\n")
    emit(
        f"- machine: {hw}; device `{args.device}`, dtype `{eng.model.dtype}`; torch {torch.__version__}, "
        f"torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; "
        f"Python {platform.python_version()}"
    )
    emit(
        f"- measured at start: matmul {machine.gflops:.0f} GFLOP/s "
        f"(fp32, 2048×{eng.model.config.hidden_size} · "
        f"{eng.model.config.hidden_size}×{getattr(eng.model.config, 'intermediate_size', 1536)}), "
        f"read {machine.read_gbs:.1f} GB/s (sum over 256 MiB)"
    )
    emit(
        f"- model `{args.model}` ({sum(p.numel() for p in eng.model.parameters()) / 1e6:.1f} M parameters, "
        f"{eng.model.config.num_hidden_layers} layers, {eng.model.config.num_key_value_heads} KV heads), "
        f"attention `{eng.model.config._attn_implementation}`"
    )
    emit(
        f"- command: `.venv/bin/python bench/bench_engine.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`"
    )
    emit(f"- load average (1 / 5 / 15 min) at start: {load_before}")
    emit(f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}")
    emit()

    results: dict[tuple[str, int], list] = {}
    kept: dict[tuple[str, int], tuple] = {}
    mem_rows = []
    docs = Path(args.out).parent if args.out else ROOT / "docs"
    block = args.block or device_kind
    suffix = "" if block == "cpu" else f"_{block}"
    if "edit" not in skip:
        emit("#### 1. Edit: `destination: Oslo → Madrid`, question with choices (Oslo, Madrid)\n")
        emit(
            "Document: a shipment record then log and policy lines; the edited line sits in the record "
            "head (top, line 4) or is moved to 10%, 50% or 90% of the document. Latency = the engine's own "
            "timing, "
            "cached notes → decision (question and choice scoring included for every strategy, recompute "
            "included); speed-up = recompute's time over the strategy's in the same call, median over calls. "
            "KL: the largest over the calls. `auto` is the sum of every probe it ran.\n"
        )
        for pos in positions:
            for size in sizes:
                doc, field, question = build(eng, shipment(size), pos)
                notes, reports = run_edit(eng, doc, field, question, args.repeats)
                results[(pos, size)] = reports
                kept[(pos, size)] = (notes, field, question)
                if pos == positions[0]:
                    mem_rows.append((notes.n_tokens, notes.nbytes()))
                samples.append(measure_machine(*mlp))
                print(
                    f"  edit {pos} {size}: done ({time.time() - t_start:.0f} s)", file=sys.stderr, flush=True
                )
        machine = Machine(max(m.gflops for m in samples), max(m.read_gbs for m in samples))
        emit("Speed-up over recompute by field position:\n")
        emit(speedup_table(results, positions, sizes))
        detail = args.detail_position if args.detail_position in positions else positions[0]
        for size in sizes:
            if size >= 2048 and (detail, size) in results:
                emit(edit_table(results[(detail, size)], detail))
        cases = [
            (*kept[(pos, size)], pos, results[(pos, size)])
            for pos in positions
            for size in sizes
            if size >= 2048 and pos in (detail, "top")
        ]
        if cases:
            emit("#### Floors: FLOPs at the measured matmul rate + one read of the notes\n")
            emit(
                f"Rates: the best of {len(samples)} measurements taken between the cases (matmul "
                f"{machine.gflops:.0f} GFLOP/s, read {machine.read_gbs:.1f} GB/s): a floor is what the "
                "strategy's work would take at the machine's best pace. Measured / floor above 1 is overhead "
                "(or a busier machine than at its best moment).\n"
            )
            emit(floor_table(eng, machine, cases))
        speed = {key: speedups(reps) for key, reps in results.items()}
        emit(speedup_by_position(docs / f"bench_speedup_positions{suffix}.png", speed, args.device))
        emit()
        lat = {
            size: {n: median_ms(results[(detail, size)], n) for n in STRATEGIES}
            for size in sizes
            if (detail, size) in results
        }
        if lat:
            emit(
                plot_latency(
                    docs / f"bench_latency{suffix}.png",
                    sorted(lat),
                    lat,
                    args.device,
                    f"Edit latency per strategy, field at {detail}",
                )
            )
            emit()
        if "breakdown" not in skip and (detail, 2048) in kept:
            notes, field, question = kept[(detail, 2048)]
            emit(
                f"#### Where the time goes ({notes.n_tokens} tokens, field at {detail}, engine pieces called "
                "directly, median of 3)\n"
            )
            emit(breakdown(eng, notes, field, question, args.device))
    if "compose" not in skip:
        emit(
            f"#### 2. Compose: a ~{args.compose_size}-token skill spliced into "
            f"a ~{args.compose_size}-token context\n"
        )
        table, _ = run_compose(eng, args.repeats, args.compose_size)
        emit(table)
    emit("#### 3. Memory\n")
    if mem_rows:
        emit("| notes tokens | notes bytes | bytes per 1,000 tokens |\n|---:|---:|---:|")
        for n, b in mem_rows:
            emit(f"| {n} | {b / 2**20:.1f} MiB | {b / n * 1000 / 2**20:.2f} MiB |")
        emit()
    kv_per_token = shape_of(eng.model).kv_bytes_per_token
    emit(
        f"Notes are the full K/V: 2 × layers × KV heads × head_dim × bytes = {kv_per_token:,} bytes "
        f"per token "
        f"in `{eng.model.dtype}` ({kv_per_token * 1000 / 2**20:.2f} MiB per 1,000 tokens); measured with "
        "`Notes.nbytes()`, scaled to 1,000 tokens."
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    emit(
        f"Peak resident set size of the whole benchmark process "
        f"(`resource.getrusage(RUSAGE_SELF).ru_maxrss`: "
        f"model weights, every report's caches, Python, torch) so far: **{rss:.0f} MiB**."
    )
    if device_kind == "cuda":
        emit(
            f"Peak CUDA memory allocated (`torch.cuda.max_memory_allocated`): "
            f"**{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB**."
        )
    emit()
    if "agreement" not in skip:
        emit(f"#### 4. Agreement with recompute over {len(AGREEMENT_CASES)} field edits\n")
        emit(
            "Cases fixed before measuring (record-style documents of 512–1,024 tokens, one field changed, "
            "read-back question with two choices; choice order alternates old/new to offset the model's "
            "first-option bias). Not tuned afterwards.\n"
        )
        emit(run_agreement(eng))
    emit(f"- load average at end: {loadavg()}; wall time {time.time() - t_start:.0f} s")
    if args.out:
        write_block(Path(args.out), block, "\n".join(out))
        print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
