"""Personal data kept from the judge, the dashboard and export: Microsoft Presidio's analyzer finds
it, its anonymizer puts a placeholder in its place.

Pattern recognisers (e-mail addresses, phone, card, IBAN, bank and social-security numbers, IP
addresses, crypto wallets) need no model. Names, places and organisations need a spaCy model the
operator installs (`python -m spacy download en_core_web_lg`) and names (`--pii-spacy-model`);
nothing is fetched at run time (tldextract, which the e-mail recogniser uses, reads the public
suffix list its package ships). Within one `Placeholders` (a judged group, a page, an export) a
value always gets the same placeholder, `<EMAIL_ADDRESS_1>`, so the judge still sees which runs
gave the same address. Only text is changed: the training token ids are never altered.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from art_proxy.errors import ConfigError
from art_proxy.records import (
    CallRecord,
    EvaluationReport,
    ExportedTrajectory,
    Judgment,
    ScenarioRecord,
    TeacherScore,
    TrajectoryRecord,
)

if TYPE_CHECKING:
    from presidio_analyzer import AnalyzerEngine
    from presidio_anonymizer import AnonymizerEngine

# What the pattern recognisers find; a spaCy model adds the named entities.
PATTERN_ENTITIES = (
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CREDIT_CARD",
    "IBAN_CODE",
    "US_BANK_NUMBER",
    "US_SSN",
    "IP_ADDRESS",
    "CRYPTO",
)
NAMED_ENTITIES = ("PERSON", "LOCATION", "NRP")
# Presidio's phone recogniser scores a bare number 0.4; below this a match is left as it is.
SCORE_THRESHOLD = 0.35
# JSON keys whose values are structure, not text anyone wrote. A message's `name` (who spoke:
# an e-mail address, a person's name) is text; a function's or a tool's is structure.
_STRUCTURE_KEYS = frozenset({"role", "type", "id", "tool_call_id", "name", "object", "model"})
INSTALL = "pip install 'art-proxy[pii]'"


@dataclass
class Placeholders:
    """One scope of consistent placeholders (see the module): the same value, the same one."""

    redactor: PiiRedactor
    _given: dict[tuple[str, str], str] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)

    def text(self, text: str) -> str:
        return self.redactor.redact(text, self._placeholder)

    def value(self, value: Any) -> Any:
        """`value` (JSON) with every string redacted but those of structural keys."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            message = "role" in value
            return {
                key: item
                if key in _STRUCTURE_KEYS and not (message and key == "name")
                else self.value(item)
                for key, item in value.items()
            }
        return value

    def _placeholder(self, entity: str, found: str) -> str:
        key = (entity, found)
        if key not in self._given:
            self._counts[entity] = self._counts.get(entity, 0) + 1
            self._given[key] = f"<{entity}_{self._counts[entity]}>"
        return self._given[key]


class PiiRedactor:
    """Presidio's engines, loaded once (see `pii_redactor`)."""

    def __init__(self, analyzer: AnalyzerEngine, anonymizer: AnonymizerEngine, named: bool) -> None:
        self._analyzer = analyzer
        self._anonymizer = anonymizer
        self.entities = [*PATTERN_ENTITIES, *(NAMED_ENTITIES if named else ())]

    def placeholders(self) -> Placeholders:
        return Placeholders(self)

    def redact(self, text: str, placeholder: Callable[[str, str], str]) -> str:
        if not text.strip():
            return text
        from presidio_anonymizer.entities import OperatorConfig

        found = self._analyzer.analyze(
            text=text, language="en", entities=self.entities, score_threshold=SCORE_THRESHOLD
        )
        if not found:
            return text
        operators = {
            entity: OperatorConfig("custom", {"lambda": functools.partial(placeholder, entity)})
            for entity in {result.entity_type for result in found}
        }
        # Presidio's two packages type the analyzer's results as two classes of one shape.
        redacted = self._anonymizer.anonymize(text, found, operators)  # type: ignore[arg-type]
        return str(redacted.text)


@functools.cache
def pii_redactor(spacy_model: str | None = None) -> PiiRedactor:
    """The redactor, built once per process; `ConfigError` when Presidio is not installed or the
    spaCy model named is not."""
    try:
        import spacy
        import tldextract.tldextract
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_anonymizer import AnonymizerEngine
    except ImportError as exc:
        raise ConfigError(f"redacting personal data needs Presidio: {INSTALL}") from exc
    # The e-mail recogniser's tldextract would fetch the public suffix list on first use.
    tldextract.tldextract.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=())
    if spacy_model is None:
        nlp = spacy.blank("en")  # tokens for the recognisers' context words; no entities
    else:
        try:
            nlp = spacy.load(spacy_model)
        except OSError as exc:
            raise ConfigError(
                f"--pii-spacy-model {spacy_model}: not installed (python -m spacy download "
                f"{spacy_model})"
            ) from exc
    engine = _loaded_spacy_engine(nlp, spacy_model or "blank")
    registry = RecognizerRegistry(supported_languages=["en"])
    with warnings.catch_warnings(), _quiet("presidio-analyzer"):
        warnings.simplefilter("ignore")
        registry.load_predefined_recognizers(nlp_engine=engine, languages=["en"])
        if spacy_model is None:
            registry.remove_recognizer("SpacyRecognizer")
        analyzer = AnalyzerEngine(nlp_engine=engine, registry=registry, supported_languages=["en"])
    anonymizer = AnonymizerEngine()  # type: ignore[no-untyped-call]  # Presidio leaves it untyped
    return PiiRedactor(analyzer, anonymizer, named=spacy_model is not None)


def _loaded_spacy_engine(nlp: Any, name: str) -> Any:
    """A Presidio NLP engine over an already loaded spaCy pipeline (its own `load` would download
    a missing model)."""
    from presidio_analyzer.nlp_engine import SpacyNlpEngine

    class Loaded(SpacyNlpEngine):
        def __init__(self) -> None:
            super().__init__(models=[{"lang_code": "en", "model_name": name}])
            self.nlp = {"en": nlp}  # type: ignore[assignment]  # None until its own load

        def load(self) -> None:
            return None

    return Loaded()


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Presidio logs each recogniser it loads and warns of languages it skips."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def redacted_call(call: CallRecord, placeholders: Placeholders) -> CallRecord:
    """The call's text redacted (bodies, answer, error); its token ids as they are."""
    return call.model_copy(
        update={
            "request": placeholders.value(call.request),
            "response": placeholders.value(call.response),
            "client_request": placeholders.value(call.client_request),
            "error": placeholders.text(call.error) if call.error is not None else None,
        }
    )


def redacted_trajectory(
    trajectory: TrajectoryRecord, placeholders: Placeholders
) -> TrajectoryRecord:
    """The trajectory and its calls redacted; a user id that is an address too."""
    calls = trajectory.calls
    return trajectory.model_copy(
        update={
            "metadata": placeholders.value(trajectory.metadata),
            "user_id": placeholders.value(trajectory.user_id),
            "calls": [redacted_call(c, placeholders) for c in calls] if calls is not None else None,
        }
    )


WITHHELD = "[withheld]"  # a token's text the page does not show


def redacted_teacher_score(
    score: TeacherScore, call: CallRecord | None, placeholders: Placeholders
) -> TeacherScore:
    """A teacher's disagreements with each token's text withheld where the call's answer holds
    anything the redactor replaces (or the call is gone): the redactor reads whole text, and a
    name's or an address's single token would pass it alone."""
    if call is not None and placeholders.value(call.response) == call.response:
        return score
    withheld = [d.model_copy(update={"text": WITHHELD}) for d in score.disagreements]
    return score.model_copy(update={"disagreements": withheld})


def redacted_export(exported: ExportedTrajectory, placeholders: Placeholders) -> ExportedTrajectory:
    """An export line's text redacted; its token ids (which decode to the original text) as
    they are."""
    return exported.model_copy(
        update={
            "trajectory": redacted_trajectory(exported.trajectory, placeholders),
            "messages": placeholders.value(exported.messages),
        }
    )


def redacted_scenario(scenario: ScenarioRecord, placeholders: Placeholders) -> ScenarioRecord:
    """The scenario's opening redacted (a conversation's first messages, as first seen)."""
    return scenario.model_copy(update={"opening": placeholders.value(scenario.opening)})


def redacted_judgment(judgment: Judgment, placeholders: Placeholders) -> Judgment:
    """The judge's reason and explanations redacted (they quote the conversations)."""
    return judgment.model_copy(
        update={
            "reason": placeholders.value(judgment.reason),
            "scores": [
                score.model_copy(update={"explanation": placeholders.text(score.explanation)})
                for score in judgment.scores
            ],
        }
    )


def redacted_evaluation(report: EvaluationReport, placeholders: Placeholders) -> EvaluationReport:
    """A report's free text redacted: what its rollouts raised (which quotes their inputs) and
    the agent's name; its figures as they are."""
    return report.model_copy(
        update={
            "agent": placeholders.text(report.agent),
            "arms": [
                arm.model_copy(update={"error": placeholders.value(arm.error)})
                for arm in report.arms
            ],
        }
    )
