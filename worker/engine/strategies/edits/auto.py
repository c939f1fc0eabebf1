"""`auto`: a composite. It runs no surgery of its own. With no adopted policy it is an oracle pick:
it measures `field_erratum` (the robust default) and its cheaper parts, and picks the cheapest part
that agrees with field_erratum under the one rule (`vocabulary.agreement`: the same choice, or the
same value named, whatever the wording); its cost is every probe it had to run, field_erratum's
included, honestly summed: its time and its tokens computed. With a policy the notebook adopted
from a sweep (`follow`), it runs only that strategy and its cost is that strategy's alone."""

from __future__ import annotations

from dataclasses import replace

from vocabulary import StrategyInfo
from vocabulary.agreement import agreement
from vocabulary.strategies import FOLLOWS_POLICY
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase, _summed
from worker.engine.strategies.edits.field_erratum import FieldErratum
from worker.engine.strategies.measure import Outcome


class Auto(Strategy[EditCase]):
    info = StrategyInfo(
        name="auto", kind="edit", rank=80,
        help="the cheapest strategy that matches field_erratum on a probe",
        recomputes="its pick's tokens, after probing the cheaper candidates",
        moves_keys=True, parts=("stale", "erratum", "in_place"), role="composite", colour="#b8a200",
        carrying=FOLLOWS_POLICY,
    )
    TARGET = FieldErratum.info.name
    policy: str | None = None
    values: tuple[str, ...] = ()  # the fields' old and new values: a probe agrees naming the same ones
    choices: tuple[str, ...] = ()

    def follow(self, policy: str | None) -> None:
        self.policy = policy

    def judge_by(self, values: tuple[str, ...], choices: tuple[str, ...]) -> None:
        self.values, self.choices = values, choices

    def _agrees(self, probe: Outcome, target: Outcome) -> bool:
        """The one rule (`vocabulary.agreement`): the same choice, or the same values named whatever
        the wording; where the target names none, the same first answer token."""
        first = int(probe.readout.logits.argmax()) == int(target.readout.logits.argmax())
        return agreement(probe.readout.decision, target.readout.decision, choices=self.choices,
                         values=self.values, first_token=first).agrees

    def needs(self) -> tuple[str, ...]:
        if self.policy is not None:
            return (self.policy,)
        return (self.TARGET, *self.info.parts)

    def outcome(self, outcomes: dict[str, Outcome]) -> Outcome:
        if self.policy is not None:
            chosen = outcomes[self.policy]
            surgery = replace(chosen.surgery, detail=f"adopted policy: {self.policy}")
            return replace(chosen, surgery=surgery, samples=list(chosen.samples), picked=self.policy)
        target = outcomes[self.TARGET]
        probes = sorted(self.info.parts, key=lambda n: outcomes[n].surgery.tokens_computed)
        picked, spent = self.TARGET, []
        for name in probes:
            spent.append(name)
            if self._agrees(outcomes[name], target):
                picked = name
                break
        spent.append(self.TARGET)
        chosen = outcomes[picked]
        probed = sum(outcomes[n].surgery.tokens_computed for n in spent)  # every probe's tokens, summed
        surgery = replace(chosen.surgery, tokens_computed=probed,  # `picked` is the fact; detail for people
                          detail=f"picked {picked} after probing {', '.join(spent)}: "
                                 f"{probed} tokens computed in all")
        return Outcome(surgery, chosen.readout, _summed([outcomes[n] for n in spent], chosen),
                       chosen.answer_nll, chosen.prefix_cache_share, picked=picked, timed=chosen.timed)
