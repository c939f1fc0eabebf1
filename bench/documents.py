"""Deterministic documents for the engine benchmark: record-style documents (a few fields, then many
lines of log and policy text that never mention a field's value), the edited field placed at the top
or at a fraction of the document, the agreement cases, and skill / context texts of a given length.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from worker.engine import Field, Question

# --------------------------------------------------------------------------------------------------
# deterministic documents

_SUBJECTS = ["The dispatcher", "The night shift", "Customer care", "The audit team", "The warehouse lead",
             "Quality control", "The billing desk", "The compliance officer",
             "Operations", "The duty manager"]
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


POSITIONS = ("top", "10%", "50%", "90%")  # where the edited field sits: in the record head, or that far in


def build(eng, case: Case, position: str = "top") -> tuple[str, Field, Question]:
    """The document (about `case.tokens` document tokens, frame included), the field and the question.
    `position` "top" keeps the edited field in the record head; "10%", "50%", "90%" move its line to
    the line boundary nearest that share of the document's characters."""
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
    while (len(lines) > len(head) + 1
           and len(eng.tokenize_document("\n".join(lines[:-1]) + "\n")[0]) >= case.tokens):
        lines.pop()
    old_value = dict(case.fields)[case.edit_label]
    field_line = f"{case.edit_label}: {old_value}"
    if position != "top":
        lines.remove(field_line)
        share = float(position.rstrip("%")) / 100
        total = sum(len(line) + 1 for line in lines)
        seen, at = 0, len(lines)
        for i, line in enumerate(lines):
            seen += len(line) + 1
            if seen >= share * total:
                at = i + 1
                break
        lines.insert(at, field_line)
    text = "\n".join(lines) + "\n"
    start = text.index(field_line) + len(case.edit_label) + 2
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
         "status", "suspended", "What is the status of this account?",
         ("active", "suspended"), 1024, seed=11),
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
