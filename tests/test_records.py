"""Records written out on simwar.core.frozen's bases (cheaper to define than dataclasses, at
every start) behave as the dataclasses they replaced: compared and shown by their fields,
a mutable one unhashable with a fresh default per instance, a frozen one hashable, refusing
assignment and pickled by its values; and the config models' annotations are objects, not
postponed text (pydantic would compile and evaluate that text at every start)."""

from __future__ import annotations
import __future__

import dataclasses
import pickle
import sys

import pytest

import simwar.config  # noqa: F401  (imports every module that defines a config model)
from simwar.analysis.happens_before import RaceReport
from simwar.analysis.hazards import HazardReport
from simwar.config.base import StrictModel
from simwar.core.run_meta import RunMeta
from simwar.executors.fast.plan import DeviceOp, Plan


def test_a_mutable_record_compares_and_shows_its_fields():
    a, b = DeviceOp(1, "main", 0, "k"), DeviceOp(1, "main", 0, "k")
    assert a == b and a != DeviceOp(1, "main", 0, "other") and a != (1, "main", 0, "k")
    assert repr(a) == ("DeviceOp(kind=1, lane='main', off=0, label='k', phase='', accesses=(), "
                       "bind=None, bound_op=None, coll='')")
    with pytest.raises(TypeError):
        hash(a)
    a.label = "changed"
    assert a != b


def test_a_default_collection_is_each_records_own():
    one, two = Plan([], {}, 0, 1), Plan([], {}, 0, 1)
    one.offsets.add(3)
    one.skeleton.append("x")
    assert two.offsets == set() and two.skeleton == []
    assert HazardReport().races is not HazardReport().races
    report = RaceReport(["race"], [4], [False], [("a", "b")])
    assert report.hazards() == HazardReport(["race"]) and report != HazardReport(["race"])


def test_a_frozen_record_is_hashable_refuses_assignment_and_pickles():
    run = RunMeta(name="cfg", steps=10, warmup_steps=2)
    assert run == RunMeta.from_meta({"name": "cfg", "steps": 10, "warmup_steps": "2"})
    assert hash(run) == hash(RunMeta(name="cfg", steps=10, warmup_steps=2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.steps = 11
    assert pickle.loads(pickle.dumps(run)) == run
    assert run.replace(steps=20).steps == 20 and run.forward_stream == "forward"


def test_the_config_models_annotations_are_not_postponed():
    # pydantic compiles and evaluates postponed annotations' text at every import
    # (simwar/config/base.py says why): each module defining a config model keeps them as
    # objects
    def models(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from models(sub)

    modules = {m.__module__ for m in models(StrictModel)} | {StrictModel.__module__}
    assert {"simwar.config.schema", "simwar.config.workload"} <= modules
    postponed = [name for name in sorted(modules)
                 if vars(sys.modules[name]).get("annotations") is __future__.annotations]
    assert postponed == []
