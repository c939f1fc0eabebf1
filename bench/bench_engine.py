"""Benchmark of the kvnotes engine: edit strategies, composition, memory, agreement with recompute.

    .venv/bin/python bench/bench_engine.py [--model smollm2-135m] [--sizes 512,1024,2048,4096] \
        [--device cpu] [--repeats 3] [--out docs/benchmarks.md] [--plot docs/bench_latency.png]

Every latency comes from the engine itself (`Engine.edit` / `Engine.compose`): each strategy is timed
in the same process, after a warm-up, from cached notes (and compiled skills) to the decision; the
old document is prefilled ONCE outside timing and each edit call is repeated `--repeats` times; the
median per strategy is reported. Speed-ups are against `recompute` measured in the same calls.

Documents are deterministic (fixed seeds): a record with several fields at the top, then many lines
of policy and log text that never mention the edited value. The question reads the field back with
two choices (old value, new value).

`--out FILE` writes the results between `<!-- bench:DEVICE:begin -->` and `<!-- bench:DEVICE:end -->`
markers (DEVICE = cpu or cuda), so hand-written prose around them survives a re-run; a file without
the markers gets the block appended. The tables are always printed to stdout as markdown.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("KVNOTES_DATA", str(ROOT / "var" / "test-data"))
# OpenMP threads that spin-wait at every barrier collapse when another process holds one of the cores:
# on this shared 2-core machine a 28-token forward took 5.5 s with 2 spinning threads against 0.26 s
# with PASSIVE waiting (see docs/benchmarks.md). Must be set before torch (libgomp) is loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from worker.engine import STRATEGIES, Field, Question, load  # noqa: E402
from worker.engine.edit import Editor, extend  # noqa: E402
from worker.engine.notes import cache_from_layers  # noqa: E402
from worker.engine.readout import _forward, _score_choices  # noqa: E402

# --------------------------------------------------------------------------------------------------
# deterministic documents

_SUBJECTS = ["The dispatcher", "The night shift", "Customer care", "The audit team", "The warehouse lead",
             "Quality control", "The billing desk", "The compliance officer", "Operations", "The duty manager"]
_VERBS = ["confirmed", "logged", "reviewed", "escalated", "closed", "re-checked", "archived", "flagged",
          "acknowledged", "updated"]
_OBJECTS = ["the pallet count", "the seal numbers", "the customs declaration", "the temperature readings",
            "the driver's timesheet", "the insurance certificate", "the loading photos", "the weight ticket",
            "the signed delivery note", "the hazard checklist", "the invoice draft", "the route plan"]
_TAILS = ["without remarks.", "after a short delay.", "and attached the scan.", "as required by the manual.",
          "with one minor discrepancy, since resolved.", "and notified the account owner.",
          "before the cut-off time.", "and filed the copy in the archive."]
_POLICIES = [
    "Policy {n}: every change to a record must be countersigned by a second employee within one working day.",
    "Policy {n}: documents older than seven years are archived and may only be read with written approval.",
    "Policy {n}: a discrepancy above two percent of the declared weight must be reported to the supervisor.",
    "Policy {n}: customer data is shared only with carriers that hold a valid data processing agreement.",
    "Policy {n}: temperature-sensitive goods are checked at every hand-over and the reading is logged.",
    "Policy {n}: an incident is closed only after the root cause and the corrective action are recorded.",
    "Policy {n}: invoices are issued within three days of delivery and paid within thirty days.",
    "Policy {n}: staff working alone at night must check in with the duty manager every two hours.",
]


def filler(seed: int) -> Iterator[str]:
    """An endless, deterministic stream of log and policy lines that name no record value."""
    rng = random.Random(seed)
    n = 0
    while True:
        n += 1
        if n % 5 == 0:
            yield rng.choice(_POLICIES).format(n=n // 5)
        else:
            day, hh, mm = 1 + (n // 24) % 28, (6 + n) % 24, rng.randrange(60)
            yield (f"2026-03-{day:02d} {hh:02d}:{mm:02d} {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} "
                   f"{rng.choice(_OBJECTS)} {rng.choice(_TAILS)}")


@dataclass(frozen=True)
class Case:
    """A record-style document, one field to change, and a read-back question with two choices."""

    name: str
    title: str
    fields: tuple[tuple[str, str], ...]  # (label, value) lines at the top, in order
    edit_label: str
    new_value: str
    question: str
    choices: tuple[str, str]
    tokens: int
    seed: int


def build(eng, case: Case) -> tuple[str, Field, Question]:
    """The document (about `case.tokens` document tokens, frame included), the field and the question."""
    head = [case.title] + [f"{k}: {v}" for k, v in case.fields] + ["", "Operations log and policy notes:"]
    lines = list(head)
    stream = filler(case.seed)
    # grow in chunks, then trim to the last line that keeps us at or under the target
    while True:
        text = "\n".join(lines) + "\n"
        n = len(eng.tokenize_document(text)[0])
        if n >= case.tokens:
            break
        per_line = 22
        for _ in range(max(1, (case.tokens - n) // per_line // 2)):
            lines.append(next(stream))
    while len(lines) > len(head) + 1 and len(eng.tokenize_document("\n".join(lines[:-1]) + "\n")[0]) >= case.tokens:
        lines.pop()
    text = "\n".join(lines) + "\n"
    old_value = dict(case.fields)[case.edit_label]
    start = text.index(f"{case.edit_label}: {old_value}") + len(case.edit_label) + 2
    field = Field(start, start + len(old_value), case.new_value, case.edit_label)
    return text, field, Question(case.question, choices=case.choices)


SHIPMENT = (("record_id", "SR-20417"), ("customer", "Halvorsen Marine AS"), ("destination", "Oslo"),
            ("carrier", "NordFreight"), ("priority", "standard"), ("status", "in transit"))


def shipment(tokens: int) -> Case:
    return Case("shipment", "SHIPMENT RECORD", SHIPMENT, "destination", "Madrid",
                "What is the destination of this shipment?", ("Oslo", "Madrid"), tokens, seed=7)


# Agreement cases: fixed a priori (documents, fields, questions, choice order) and NOT tuned afterwards.
# Choice order alternates between (old, new) and (new, old) because this model leans to the first option.
AGREEMENT_CASES = [
    shipment(512),
    Case("account", "ACCOUNT RECORD", (("account_id", "AC-88213"), ("owner", "Dana Whitfield"),
         ("plan", "business"), ("status", "active"), ("region", "EU-North"), ("opened", "2019-04-02")),
         "status", "suspended", "What is the status of this account?", ("active", "suspended"), 1024, seed=11),
    Case("booking", "HOTEL BOOKING", (("booking_ref", "HB-5521"), ("guest", "Marta Kowalski"),
         ("room_type", "single"), ("nights", "3"), ("breakfast", "included"), ("arrival", "2026-05-14")),
         "room_type", "double", "What room type is booked?", ("double", "single"), 512, seed=23),
    Case("ticket", "SUPPORT TICKET", (("ticket_id", "T-30990"), ("reporter", "Sam Okafor"),
         ("product", "billing portal"), ("priority", "low"), ("assignee", "second line"), ("sla", "5 days")),
         "priority", "urgent", "What is the priority of this ticket?", ("urgent", "low"), 1024, seed=31),
    Case("patient", "PATIENT INTAKE", (("patient_id", "P-1187"), ("name", "Ivo Brandt"), ("age", "54"),
         ("allergy", "penicillin"), ("ward", "cardiology"), ("admitted", "2026-02-09")),
         "allergy", "latex", "What is the patient allergic to?", ("penicillin", "latex"), 512, seed=43),
    Case("invoice", "INVOICE", (("invoice_no", "INV-77120"), ("supplier", "Keller Tools GmbH"),
         ("currency", "EUR"), ("amount", "12,480.00"), ("due", "2026-04-30"), ("terms", "net 30")),
         "currency", "USD", "In which currency is this invoice?", ("USD", "EUR"), 1024, seed=53),
    Case("employee", "EMPLOYEE FILE", (("employee_id", "E-4410"), ("name", "Leila Haddad"),
         ("department", "Finance"), ("grade", "B2"), ("manager", "Tom Reyes"), ("start_date", "2021-09-01")),
         "department", "Marketing", "Which department does this employee work in?", ("Finance", "Marketing"),
         768, seed=67),
    Case("flight", "FLIGHT MANIFEST", (("flight", "NX 418"), ("aircraft", "A320"), ("origin", "Berlin"),
         ("crew", "6"), ("passengers", "152"), ("departure", "07:40")),
         "origin", "Lisbon", "From which city does this flight depart?", ("Lisbon", "Berlin"), 768, seed=79),
]

SKILL_SEED, CONTEXT_SEED = 101, 202
SKILL_HEAD = ("Returns handling procedure. Follow these rules when a customer asks to return goods. "
              "A return is accepted within 30 days of delivery when the goods are unused. The refund goes "
              "to the original payment method. Damaged goods are photographed before they are accepted.\n")


def text_of_tokens(eng, head: str, seed: int, tokens: int, framed: bool) -> str:
    lines, stream = [head], filler(seed)
    count = (lambda t: len(eng.tokenize_document(t)[0])) if framed else (lambda t: len(eng.encode(t)))
    while count("\n".join(lines) + "\n") < tokens:
        lines.append(next(stream))
    if len(lines) > 2:
        lines.pop()
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# measuring

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


def fmt_kl(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.2e}" if x < 1e-3 else f"{x:.3f}"


def edit_table(size: int, notes, reports) -> tuple[str, dict[str, float]]:
    first = reports[0]
    rec_ms = median_ms(reports, "recompute")
    rec_tokens = first.strategies["recompute"].tokens_computed
    lat = {name: median_ms(reports, name) for name in first.strategies}
    rows = [
        f"**{first.document_tokens} document tokens** (recompute decision: "
        f"`{first.strategies['recompute'].decision}`; median of {len(reports)} runs)\n",
        "| strategy | latency ms (median) | runs ms | speed-up | tokens computed | % of recompute | KL to recompute "
        "| top-1 | decision | matches |",
        "|---|---:|---|---:|---:|---:|---:|:-:|---|:-:|",
    ]
    for name, r in first.strategies.items():
        runs = ", ".join(f"{rep.strategies[name].latency_ms:.0f}" for rep in reports)
        extra = f" ({r.detail})" if name in ("auto", "selective") and r.detail else ""
        rows.append(
            f"| {name}{extra} | {lat[name]:.1f} | {runs} | {rec_ms / lat[name]:.1f}× | {r.tokens_computed} | "
            f"{100 * r.tokens_computed / rec_tokens:.1f}% | {fmt_kl(r.kl_to_recompute)} | "
            f"{'yes' if r.top1_agrees else 'no'} | {r.decision} | {'yes' if r.decision_matches_recompute else '**no**'} |"
        )
    return "\n".join(rows) + "\n", lat


@torch.inference_mode()
def breakdown(eng, notes, field: Field, question: Question, device: str, repeats: int = 3) -> str:
    """Where the time of recompute and erratum goes: the surgery, then the readout — one forward
    holding any appended (pending) erratum tokens, the question and every choice (the engine's
    fast path), against the same readout done as three separate forwards (for comparison)."""
    from worker.engine.offsets import apply_fields as _apply_fields
    from worker.engine.readout import decide
    from worker.engine.vocabulary import render_erratum

    new_text = _apply_fields(notes.text, [field])
    new_ids, new_offsets, new_segments = eng.tokenize_document(new_text)
    editor = Editor(eng.model, eng.rope, notes, new_ids, new_segments, new_offsets)
    err_ids = eng.encode(render_erratum(field.label, notes.text[field.start:field.end], field.new_value))
    suffix_ids = eng.encode(eng.frame.suffix(question))
    choice_tokens = sum(len(eng.tokenizer(eng.frame.choice_text(c), add_special_tokens=False)["input_ids"])
                        for c in question.choices)
    rows = ["| strategy | surgery ms | one-pass readout ms (pending + question + choices) | total ms "
            "| same readout as 3 separate forwards ms | tokens (surgery + pending + question + choices) |",
            "|---|---:|---:|---:|---:|---|"]
    for name, fn in (("recompute", editor.recompute), ("erratum", lambda: editor.erratum(err_ids)),
                     ("prefix_reuse", editor.prefix_reuse)):
        parts = []
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            s = fn()
            sync(device)
            t1 = time.perf_counter()
            decide(eng.model, eng.tokenizer, eng.frame, cache_from_layers(s.layers), suffix_ids, question,
                   pending=s.pending)
            sync(device)
            t2 = time.perf_counter()
            layers = extend(eng.model, s.layers, s.pending) if s.pending else s.layers
            cache = cache_from_layers(layers)
            logits = _forward(eng.model, suffix_ids, cache)
            _score_choices(eng.model, eng.tokenizer, eng.frame, logits, cache, question.choices)
            sync(device)
            t3 = time.perf_counter()
            parts.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
        a, b, c = (statistics.median(p[i] for p in parts) for i in range(3))
        computed = s.tokens_computed - len(s.pending)
        rows.append(f"| {name} | {a:.1f} | {b:.1f} | {a + b:.1f} | {c:.1f} | "
                    f"{computed} + {len(s.pending)} + {len(suffix_ids)} + {choice_tokens} ({len(question.choices)} choices) |")
    return "\n".join(rows) + "\n"


def run_compose(eng, repeats: int, size: int) -> tuple[str, dict]:
    context = text_of_tokens(eng, "DISPATCH LOG\ncarrier: NordFreight\nwarehouse: Gdansk-2\n", CONTEXT_SEED, size, True)
    skill_text = text_of_tokens(eng, SKILL_HEAD, SKILL_SEED, size, False)
    ctx_notes = eng.prefill(context)  # outside timing
    skill = eng.compile_skill(skill_text)  # outside timing
    question = Question("Within how many days can a customer return unused goods?", choices=("30", "7"))
    middle = context.index("\n", len(context) // 2) + 1
    rows = [f"Context {ctx_notes.n_tokens} tokens (frame included), skill {skill.n_tokens - 1} tokens "
            f"(+1 sink, dropped when spliced); median of {repeats} runs.\n",
            "| placement | seam K | recompute ms | splice ms | speed-up | tokens computed (splice / recompute) "
            "| KL to recompute | top-1 | top-10 overlap | decision (splice / recompute) |",
            "|---|---:|---:|---:|---:|---|---:|:-:|---:|---|"]
    summary = {}
    for where, at in (("end", None), ("middle", middle)):
        for seam in (0, 4):
            reps = [eng.compose(ctx_notes, [skill], question, at=at, seam=seam) for _ in range(repeats)]
            rec, spl = median_ms(reps, "recompute"), median_ms(reps, "splice")
            r, s = reps[0].strategies["recompute"], reps[0].strategies["splice"]
            summary[(where, seam)] = (rec, spl, s.kl_to_recompute)
            rows.append(f"| {where} | {seam} | {rec:.1f} | {spl:.1f} | {rec / spl:.1f}× | "
                        f"{s.tokens_computed} / {r.tokens_computed} | {fmt_kl(s.kl_to_recompute)} | "
                        f"{'yes' if s.top1_agrees else 'no'} | {s.topk_overlap} | {s.decision} / {r.decision} |")
    return "\n".join(rows) + "\n", summary


def run_agreement(eng) -> str:
    names = [s for s in STRATEGIES if s != "recompute"]
    match = {s: 0 for s in names}
    kls = {s: [] for s in names}
    per_case = ["| case | tokens | field | choices | recompute old → new | " + " | ".join(names) + " |",
                "|---|---:|---|---|---|" + "|".join([":-:"] * len(names)) + "|"]
    flips = 0
    for case in AGREEMENT_CASES:
        doc, field, question = build(eng, case)
        notes = eng.prefill(doc)
        old_q = Question(question.text, question.choices)
        # recompute's decision on the OLD document: does the edit flip it at all?
        base = eng.edit(notes, [Field(field.start, field.end, doc[field.start:field.end], field.label)], old_q,
                        strategies=["recompute"]).strategies["recompute"].decision
        rep = eng.edit(notes, [field], question, strategies=list(STRATEGIES))
        rec = rep.strategies["recompute"].decision
        flips += base.strip().lower() != rec.strip().lower()
        cells = []
        for s in names:
            r = rep.strategies[s]
            match[s] += r.decision_matches_recompute
            kls[s].append(r.kl_to_recompute)
            cells.append(("✓" if r.decision_matches_recompute else "✗") + f" {r.decision}")
        per_case.append(f"| {case.name} | {rep.document_tokens} | {case.edit_label}: "
                        f"{doc[field.start:field.end]} → {field.new_value} | {', '.join(case.choices)} | "
                        f"{base} → {rec} | " + " | ".join(cells) + " |")
    n = len(AGREEMENT_CASES)
    summary = ["| strategy | decisions matching recompute | mean KL to recompute | median KL |",
               "|---|---:|---:|---:|"]
    for s in names:
        summary.append(f"| {s} | {match[s]}/{n} | {fmt_kl(statistics.mean(kls[s]))} | "
                       f"{fmt_kl(statistics.median(kls[s]))} |")
    return (f"Recompute's decision flipped with the edit in **{flips}/{n}** cases (a strategy that keeps the "
            f"old notes can only 'match' where recompute did not flip).\n\n" + "\n".join(summary) + "\n\n"
            "Per case (✓ = same decision as recompute on the edited document):\n\n" + "\n".join(per_case) + "\n")


def plot(path: Path, sizes: list[int], lat: dict[int, dict[str, float]], device: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(matplotlib not installed: no plot written)"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(next(iter(lat.values())).keys())
    for i, name in enumerate(names):  # one fixed colour per strategy in both panels
        colour = f"C{i}"
        ys = [lat[s][name] for s in sizes]
        a1.plot(sizes, ys, marker="o", label=name, color=colour)
        if name != "recompute":
            a2.plot(sizes, [lat[s]["recompute"] / lat[s][name] for s in sizes], marker="o", label=name, color=colour)
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes])
        ax.set_xlabel("document tokens (target)")
        ax.grid(True, which="both", alpha=0.3)
    a1.set_ylabel("latency to decision, ms (median)")
    a1.set_title(f"Edit latency per strategy ({device})")
    a2.set_ylabel("speed-up over recompute (×)")
    a2.set_title("Speed-up over recompute, same run")
    a2.axhline(20, color="grey", linestyle="--", linewidth=1)
    a2.text(sizes[0], 21, "20× target (erratum @2,048)", fontsize=8, color="grey")
    a1.legend(fontsize=8)
    a2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return f"![latency]({path.name})"


def write_block(out: Path, device: str, body: str) -> None:
    begin, end = f"<!-- bench:{device}:begin -->", f"<!-- bench:{device}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = out.read_text(encoding="utf-8") if out.exists() else ""
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda m: block, text, flags=re.S)
    else:
        text = (text.rstrip() + "\n\n" if text else "") + block + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--sizes", default="512,1024,2048,4096")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (CPU)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compose-size", type=int, default=1024)
    p.add_argument("--skip", default="", help="comma-separated sections to skip: edit,breakdown,compose,agreement")
    p.add_argument("--out", default=None, help="markdown file to write the results block into")
    p.add_argument("--plot", default=None, help="PNG path (default: docs/bench_latency[_DEVICE].png next to --out)")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
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

    hw = (torch.cuda.get_device_name(0) if device_kind == "cuda" else
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    emit(f"### Run ({device_kind})\n")
    emit(f"- machine: {hw}; device `{args.device}`, dtype `{eng.model.dtype}`; torch {torch.__version__}, "
         f"torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; Python {platform.python_version()}")
    emit(f"- model `{args.model}` ({sum(p.numel() for p in eng.model.parameters()) / 1e6:.1f} M parameters, "
         f"{eng.model.config.num_hidden_layers} layers, {eng.model.config.num_key_value_heads} KV heads)")
    emit(f"- command: `.venv/bin/python bench/bench_engine.py {' '.join(argv if argv is not None else sys.argv[1:])}`")
    emit(f"- load average (1 / 5 / 15 min) at start: {load_before}")
    emit(f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}")
    emit()

    lat: dict[int, dict[str, float]] = {}
    mem_rows = []
    if "edit" not in skip:
        emit("#### 1. Edit: `destination: Oslo → Madrid`, question with choices (Oslo, Madrid)\n")
        emit("Document: a shipment record (six fields) then log and policy lines; the field is on line 4. "
             "Latency = the engine's own timing, cached notes → decision (the question and the choice "
             "scoring are included for every strategy, recompute included). `auto` is the sum of every "
             "probe it ran.\n")
        keep = None
        for size in sizes:
            doc, field, question = build(eng, shipment(size))
            notes, reports = run_edit(eng, doc, field, question, args.repeats)
            table, lat[size] = edit_table(size, notes, reports)
            emit(table)
            mem_rows.append((notes.n_tokens, notes.nbytes()))
            if size == 2048 or keep is None:
                keep = (size, notes, field, question)
        if "breakdown" not in skip and keep is not None:
            size, notes, field, question = keep
            emit(f"#### Where the time goes ({notes.n_tokens} tokens, engine pieces called directly, median of 3)\n")
            emit(breakdown(eng, notes, field, question, args.device))
    if "compose" not in skip:
        emit(f"#### 2. Compose: a ~{args.compose_size}-token skill spliced into a ~{args.compose_size}-token context\n")
        table, _ = run_compose(eng, args.repeats, args.compose_size)
        emit(table)
    # memory
    emit("#### 3. Memory\n")
    if mem_rows:
        emit("| notes tokens | notes bytes | bytes per 1,000 tokens |\n|---:|---:|---:|")
        for n, b in mem_rows:
            emit(f"| {n} | {b / 2**20:.1f} MiB | {b / n * 1000 / 2**20:.2f} MiB |")
        emit()
    kv_per_token = 2 * eng.model.config.num_hidden_layers * eng.model.config.num_key_value_heads * \
        (getattr(eng.model.config, "head_dim", None) or eng.model.config.hidden_size // eng.model.config.num_attention_heads) * \
        torch.tensor([], dtype=eng.model.dtype).element_size()
    emit(f"Notes are the full K/V: 2 × layers × KV heads × head_dim × bytes = {kv_per_token:,} bytes per token "
         f"in `{eng.model.dtype}` ({kv_per_token * 1000 / 2**20:.2f} MiB per 1,000 tokens); measured with "
         "`Notes.nbytes()`, scaled to 1,000 tokens.")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    emit(f"Peak resident set size of the whole benchmark process (`resource.getrusage(RUSAGE_SELF).ru_maxrss`: "
         f"model weights, every report's caches, Python, torch) so far: **{rss:.0f} MiB**.")
    if device_kind == "cuda":
        emit(f"Peak CUDA memory allocated (`torch.cuda.max_memory_allocated`): "
             f"**{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB**.")
    emit()
    if "agreement" not in skip:
        emit(f"#### 4. Agreement with recompute over {len(AGREEMENT_CASES)} field edits\n")
        emit("Cases fixed before measuring (record-style documents of 512–1,024 tokens, one field changed, "
             "read-back question with two choices; choice order alternates old/new to offset the model's "
             "first-option bias). Not tuned afterwards.\n")
        emit(run_agreement(eng))
    if lat:
        out_path = Path(args.out) if args.out else ROOT / "docs" / "benchmarks.md"
        png = Path(args.plot) if args.plot else out_path.parent / (
            "bench_latency.png" if device_kind == "cpu" else f"bench_latency_{device_kind}.png")
        emit(plot(png, sizes, lat, args.device))
        emit()
    emit(f"- load average at end: {loadavg()}; wall time {time.time() - t_start:.0f} s")
    if args.out:
        write_block(Path(args.out), device_kind, "\n".join(out))
        print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
