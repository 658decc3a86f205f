from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskkit.errors import ConfigurationError, PayloadInvalid
from taskkit.job import Job, decode_job, peek_task, validate_queue_name


def test_the_minimal_foreign_form_gets_the_defaults() -> None:
    job = decode_job(b'{"task": "emails.send", "args": ["a@b"], "kwargs": {}}')
    assert (job.task, job.args, job.queue, job.priority, job.v) == (
        "emails.send",
        ["a@b"],
        "default",
        0,
        1,
    )
    assert len(job.id) == 32 and job.max_attempts is None and job.run_at is None


def test_wire_format_round_trips_and_omits_empty_options() -> None:
    job = Job(task="t", args=[1], kwargs={"a": [None]}, queue="q", dedupe_key="k")
    wire = json.loads(job.to_wire())
    assert "max_attempts" not in wire and wire["dedupe_key"] == "k"
    assert decode_job(job.to_wire()) == job


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    assert decode_job('{"task": "t", "added_in_v2": true}').task == "t"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "not valid JSON"),
        (b"\xff", "UTF-8"),
        (b'"text"', "must be a JSON object"),
        (b'{"task": 1}', "task"),
        (b'{"task": "a b"}', "task name"),
        (b'{"task": "bad\\u0000name"}', "task name"),
        (b'{"task": "t", "queue": "../../etc"}', "queue"),
        (b'{"task": "t", "v": 2}', "v"),
        (b'{"task": "t", "max_attempts": 0}', "max_attempts"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_bad_payloads_are_refused_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(PayloadInvalid, match=reason):
        decode_job(raw)


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_the_decoder_never_raises_anything_but_payload_invalid(raw: bytes) -> None:
    try:
        decode_job(raw)
    except PayloadInvalid:
        pass


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=20,
    )
)
def test_any_json_value_as_args_round_trips(value: object) -> None:
    job = Job(task="t", args=[value])
    assert decode_job(job.to_wire()).args == [value]


def test_peek_task_is_best_effort() -> None:
    assert peek_task('{"task": "x"}') == "x"
    assert peek_task(b"\xff") is None and peek_task("[]") is None
    assert peek_task('{"task": "bad\\u0000name"}') is None


@pytest.mark.parametrize("name", ["", "a b", "x" * 200, "-lead", "q}{", "a\nb"])
def test_queue_names_are_validated(name: str) -> None:
    with pytest.raises(ConfigurationError):
        validate_queue_name(name)


def test_the_json_schema_file_matches_the_model() -> None:
    from pathlib import Path

    import taskkit

    path = Path(taskkit.__file__).with_name("job.schema.json")
    on_disk = json.loads(path.read_text())
    for key in ("$schema", "title", "description"):
        on_disk.pop(key)
    generated = Job.model_json_schema()
    generated.pop("title"), generated.pop("description")
    assert on_disk == generated, "regenerate taskkit/job.schema.json from taskkit.job.Job"


def test_a_trailing_newline_is_not_part_of_a_valid_name() -> None:
    with pytest.raises(ConfigurationError):
        validate_queue_name("mail\n")
    assert peek_task('{"task": "t.ok\\n"}') is None
    assert peek_task('{"task": "t.ok"}') == "t.ok"


def test_a_trusted_job_is_the_same_as_a_validated_one() -> None:
    fields = {"id": "a" * 32, "task": "t.x", "args": [1], "queue": "mail", "run_at": 5.0}
    trusted, validated = Job.trusted(**fields), Job(**fields)  # type: ignore[arg-type]
    assert trusted == validated and trusted.to_wire() == validated.to_wire()
    assert trusted.model_fields_set == validated.model_fields_set
    assert Job.trusted(id="b", task="t.y").args == [] == Job(id="b", task="t.y").args
