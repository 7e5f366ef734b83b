"""The messages between the grader, a judge and a box's worker: one schema (labkit/course/grade/messages.py), held
by the side that sends and by the side that reads; every op the code sends is in it."""
from __future__ import annotations

import ast
import json
import os
import time
from pathlib import Path

import pytest

from labkit.course.grade import calls, judge, messages, wire
from labkit.course.grade.options import Limits

ROOT = Path(__file__).resolve().parent.parent
GRADE = ROOT / "labkit" / "course" / "grade"


def test_a_message_is_held_to_its_op_s_fields_and_types():
    made = messages.make(messages.FROM_CHILD, "verdict", status="passed", message="[ex 2.1] passed")
    assert made == {"op": "verdict", "status": "passed", "message": "[ex 2.1] passed"}
    assert messages.checked(messages.FROM_CHILD, made, ["verdict", "tried"]) is made
    for bad, said in (({"op": "verdict", "status": "passed"}, "verdict: missing field message"),
                      ({**made, "extra": 1}, "verdict: unknown field extra"),
                      ({**made, "status": 1}, "field status is a int, not str"),
                      ({"op": "ended", "how": "x", "status": True, "seconds": 1.0}, "op 'ended' where"),
                      (["op", "verdict"], "a message is a JSON object, not list"),
                      ({"op": "forged"}, "op 'forged' where")):
        with pytest.raises(messages.MessageError, match=said):
            messages.checked(messages.FROM_CHILD, bad)
    with pytest.raises(messages.MessageError, match="op 'verdict' where loaded was expected"):
        messages.checked(messages.FROM_CHILD, made, ["loaded"])
    with pytest.raises(messages.MessageError, match="field status is a bool, not int or null"):
        messages.checked(messages.FROM_BOX, {"op": "ended", "how": "ended", "status": True, "seconds": 0.5})
    with pytest.raises(messages.MessageError, match="missing field seconds"):
        messages.make(messages.TO_BOX, "race", plans={}, reference={})  # the sender's own bug fails before it leaves


def _sent_ops(path: Path) -> set[tuple[str, str]]:
    """(table or "literal", op) of every message `path` builds: messages.make(TABLE, "op", ...) and {"op": "..."}."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "make" and len(node.args) >= 2:
            table, op = node.args[0], node.args[1]
            if isinstance(op, ast.Constant):
                found.add((getattr(table, "attr", "?"), op.value))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "op" and isinstance(value, ast.Constant):
                    found.add(("literal", value.value))
    return found


def test_every_message_the_grader_judge_and_worker_send_is_in_the_schema():
    tables = {"REQUESTS": messages.REQUESTS, "ANSWERS": messages.ANSWERS, "TO_BOX": messages.TO_BOX,
              "FROM_BOX": messages.FROM_BOX, "FROM_CHILD": messages.FROM_CHILD}
    every = {op for table in tables.values() for op in table}
    sent = set().union(*(_sent_ops(GRADE / f) for f in ("grader.py", "judge.py", "calls.py", "worker.py")))
    assert sent, "found no message: the scan is broken"
    for table, op in sent:
        assert op in (tables[table] if table in tables else every), (table, op)
    assert ("literal", "call") in sent and ("FROM_CHILD", "verdict") in sent and ("REQUESTS", "grade") in sent


class _Watch:
    why = ""


def _channel_with(message: dict) -> calls.Channel:
    """A judge's channel whose box has sent `message` (framed, as the worker sends)."""
    read, write = os.pipe()
    wire.send(write, message)
    os.close(write)
    channel = calls.Channel(os.open(os.devnull, os.O_WRONLY), read, _Watch())
    channel.deadline = time.monotonic() + 60
    return channel


def test_a_child_s_message_out_of_the_schema_ends_the_box_naming_the_break():
    forged = {"op": "child", "message": {"op": "verdict", "status": "passed"}}  # no message field
    with pytest.raises(calls.BoxGone, match="broke the protocol .*verdict: missing field message"):
        _channel_with(forged).from_child(("verdict",))
    with pytest.raises(calls.BoxGone, match="broke the protocol .*op 'result' where verdict was expected"):
        _channel_with({"op": "child", "message": {"op": "result", "value": 1, "after": []}}).from_child(("verdict",))
    # once the check is done, whatever the child says is read as it is (the caller calls it tampering)
    assert _channel_with(forged).from_child(None) == forged["message"]
    with pytest.raises(calls.BoxGone, match=r"broke the protocol \(child: unknown field extra\)"):
        _channel_with({"op": "child", "message": {}, "extra": 1}).receive()
    with pytest.raises(calls.BoxGone, match="^ended: timeout$"):
        _channel_with({"op": "ended", "how": "timeout", "status": 9, "seconds": 61.0}).from_child(("verdict",))


def test_a_judge_answers_a_request_out_of_the_schema_with_its_own_error():
    limits = Limits(seed=1).as_json()
    request = messages.make(messages.REQUESTS, "grade", job={}, limits=limits, cpus=None, argv=[], env=None,
                            cwd=None, race=None)
    for bad, said in (({k: v for k, v in request.items() if k != "cpus"}, "missing field cpus"),
                      ({**request, "limits": {**limits, "seed": "1"}}, "seed '1': must be an int"),
                      ({**request, "limits": {**limits, "memory_gib": 0}}, "--memory 0: must be a positive number")):
        answer = json.loads(judge._answer(json.dumps(bad)))
        assert answer["op"] == "graded" and answer["outcomes"] == {} and said in answer["ended"], answer
        messages.checked(messages.ANSWERS, answer)
