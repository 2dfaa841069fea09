"""The checker against wrong backwards nobody wrote by hand: every mutant of a reference
backward or of a bug's fix that a random sweep of the contract tells from the reference must
fail the checker's default run. ``mutants.json`` holds every mutant's verdict (regenerate it with
``python -m attention_ref.exercises.mutation --write tests/exercises/mutants.json``, a few
minutes); this test re-derives one mutant in twelve and checks that the file says the same."""
import json
from collections import Counter
from pathlib import Path

import pytest

from attention_ref.exercises import EXERCISES
from attention_ref.exercises.mutation import _sweep, mutants, verdict

VERDICTS = json.loads((Path(__file__).parent / "mutants.json").read_text())
SAMPLE = 12  # one mutant in twelve is re-derived in the default suite


def test_a_few_hundred_mutants_of_every_origin_and_every_kind():
    assert len(VERDICTS) >= 600
    origins = Counter(v["origin"] for v in VERDICTS)
    assert len(origins) == len(EXERCISES) + 11  # every reference backward and every bug's fix
    kinds = " ".join(v["change"] for v in VERDICTS)
    for kind in ("Add -> Sub", "Mult -> Div", "operand dropped", "constant", "transpose dropped",
                 "factors of @ swapped", "keepdims=True dropped", "over every axis", "swapped",
                 "cast to float64", "squeezed", "scale from the last axis of q", "fewer axes", "sum over the broadcast axes dropped",
                 "only when it is the first", "renormalised by its sum"):  # the last two: issue 42
        assert kind in kinds, kind


def test_every_wrong_mutant_fails_the_checker():
    wrong = [v for v in VERDICTS if v["wrong"]]
    missed = [f"{v['origin']} #{v['index']}: {v['change']}" for v in wrong if not v["caught"]]
    assert len(wrong) >= 500 and not missed, missed


def test_the_score_in_docs_exercises_md():
    wrong = sum(v["wrong"] for v in VERDICTS)
    caught = sum(bool(v["caught"]) for v in VERDICTS)
    text = (Path(__file__).parents[2] / "docs" / "exercises.md").read_text()
    assert f"{len(VERDICTS)} mutants, {wrong} wrong on the sweep, {caught} of them fail the checker" in text


_MUTANTS = list(mutants())


def test_the_mutants_are_the_ones_in_the_file():
    assert [(m.origin, m.index, m.change) for m in _MUTANTS] == \
        [(v["origin"], v["index"], v["change"]) for v in VERDICTS]


@pytest.mark.parametrize("position", range(0, len(_MUTANTS), SAMPLE))
def test_a_sample_of_the_verdicts_is_re_derived(position, draws={}):
    m = _MUTANTS[position]
    if m.exercise not in draws:
        draws[m.exercise] = _sweep(EXERCISES[m.exercise])
    assert verdict(m, draws[m.exercise]) == VERDICTS[position]
