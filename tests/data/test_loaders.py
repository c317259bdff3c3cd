"""Rubric loaders on the real HealthBench sample and on small (broken) files written by the tests."""

import json

import pytest

from rise_nemo.core.rewards import rubric_reward
from rise_nemo.core.rubric import RubricError
from rise_nemo.data.loaders import load_rubric_prompts


def _write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_healthbench_sample_loads_all_60(healthbench_path):
    prompts, skipped = load_rubric_prompts(healthbench_path)
    assert len(prompts) == 60 and skipped == []
    raw = [json.loads(line) for line in healthbench_path.read_text().splitlines() if line.strip()]
    for p, r in zip(prompts, raw, strict=True):
        assert p.prompt_id == r["prompt_id"]
        assert [dict(m) for m in p.messages] == r["prompt"]
        assert p.messages[-1]["role"] == "user"
        assert [c.weight for c in p.rubric.criteria] == [c["points"] for c in r["rubrics"]]
        assert [c.text for c in p.rubric.criteria] == [c["criterion"].strip() for c in r["rubrics"]]
        assert p.source.endswith(f":{raw.index(r) + 1}")
    negatives = sum(c.is_negative for p in prompts for c in p.rubric.criteria)
    assert negatives > 0  # the sample has negative-points criteria
    assert all(
        t.startswith(("axis:", "cluster:", "level:"))
        for p in prompts
        for c in p.rubric.criteria
        for t in c.tags
    )
    # a response meeting exactly the positive criteria scores 1 under eq. 3
    first = prompts[0].rubric
    assert rubric_reward([c.weight > 0 for c in first.criteria], first.weights).item() == pytest.approx(1.0)


def test_rubrichub_verl_and_rar_and_own_formats(tmp_path):
    msgs = [{"role": "user", "content": "Write a haiku about rain."}]
    rows = [
        {
            "prompt": msgs,
            "Rubrics": [{"criterion": "Has three lines", "points": 5, "tags": {"verifier": "llm"}}],
        },
        {
            "prompt": msgs,
            "data_source": "rubrichub_writing",
            "extra_info": {"index": 7},
            "reward_model": json.dumps(
                {"style": "rubric", "rubrics": [{"criterion": "Mentions rain", "points": 3}]}
            ),
        },
        {
            "question": "What is 2+2?",
            "rubric": [
                {"description": "States 4", "title": "Essential Criteria", "weight": 5},
                {"description": "Rambles", "title": "Pitfall Criteria", "weight": -1},
            ],
            "reference_answer": "4",
        },
        {
            "prompt_id": "own-1",
            "messages": msgs,
            "rubric": [
                {
                    "criterion": "Short",
                    "points": 2,
                    "tags": ["style"],
                    "check": {"kind": "max_words", "value": 20},
                }
            ],
            "reference": "Rain falls",
        },
    ]
    prompts, skipped = load_rubric_prompts(_write_jsonl(tmp_path / "mixed.jsonl", rows))
    assert skipped == [] and len(prompts) == 4
    hub, verl, rar, own = prompts
    assert hub.rubric.criteria[0].tags == ("verifier:llm",) and hub.prompt_id == "mixed-1"
    assert verl.prompt_id == "rubrichub_writing-7" and verl.rubric.criteria[0].text == "Mentions rain"
    assert rar.messages == ({"role": "user", "content": "What is 2+2?"},) and rar.reference == "4"
    assert rar.rubric.weights == [5.0, -1.0] and rar.rubric.criteria[1].tags == ("title:Pitfall Criteria",)
    assert own.prompt_id == "own-1" and own.rubric.criteria[0].check.kind == "max_words"
    assert own.reference == "Rain falls"
    # explicit format: a HealthBench file read as RaR fails clearly
    with pytest.raises(RubricError, match="mixed.jsonl:1: key 'question': missing"):
        load_rubric_prompts(tmp_path / "mixed.jsonl", fmt="rar")


def test_parquet_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(
        [
            {
                "prompt": [{"role": "user", "content": f"q{i}"}],
                "reward_model": {"rubrics": [{"criterion": "c", "points": 1.0 + i}]},
                "extra_info": {"index": i},
            }
            for i in range(3)
        ]
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    prompts, skipped = load_rubric_prompts(path)
    assert [p.rubric.weights for p in prompts] == [[1.0], [2.0], [3.0]]
    assert prompts[2].source == f"{path}:3" and prompts[0].prompt_id == "rubrichub-0"


BAD = {
    "malformed JSON": ('{"prompt": [', "malformed JSON"),
    "missing prompt": (
        {"rubrics": [{"criterion": "a", "points": 1}], "Rubrics": None, "prompt": None},
        "'prompt': missing",
    ),
    "no criteria": (
        {"prompt": [{"role": "user", "content": "x"}], "rubrics": []},
        "'rubrics': expected a non-empty",
    ),
    "non-numeric points": (
        {"prompt": [{"role": "user", "content": "x"}], "rubrics": [{"criterion": "a", "points": "five"}]},
        r"'rubrics\[0\].points': points must be a number",
    ),
    "all non-positive": (
        {"prompt": [{"role": "user", "content": "x"}], "rubrics": [{"criterion": "a", "points": -2}]},
        "no criterion has positive points",
    ),
    "empty criterion": (
        {"prompt": [{"role": "user", "content": "x"}], "rubrics": [{"criterion": "  ", "points": 2}]},
        r"'rubrics\[0\].criterion': criterion text is missing or empty",
    ),
    "last turn not user": (
        {"prompt": [{"role": "assistant", "content": "x"}], "rubrics": [{"criterion": "a", "points": 2}]},
        "last message must be the user's",
    ),
    "unknown keys": ({"text": "hello"}, "cannot tell the record's format"),
    "bad check": (
        {
            "prompt_id": "p",
            "messages": [{"role": "user", "content": "x"}],
            "rubric": [{"criterion": "a", "points": 1, "check": {"kind": "vibes", "value": 1}}],
        },
        r"'rubric\[0\].check': unknown machine check kind",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_record_names_file_line_and_key(tmp_path, case):
    bad, pattern = BAD[case]
    good = {"prompt": [{"role": "user", "content": "fine"}], "rubrics": [{"criterion": "ok", "points": 1}]}
    path = _write_jsonl(tmp_path / "data.jsonl", [good, "", bad, good | {"prompt_id": "last"}])
    with pytest.raises(RubricError, match=rf"data\.jsonl:3: .*{pattern}|data\.jsonl:3: {pattern}"):
        load_rubric_prompts(path)
    prompts, skipped = load_rubric_prompts(path, skip_invalid=True)
    assert [p.prompt_id for p in prompts] == ["data-1", "last"]
    assert len(skipped) == 1 and skipped[0].where.endswith("data.jsonl:3")


def test_duplicate_ids_missing_file_and_bad_fmt(tmp_path):
    row = {
        "prompt_id": "same",
        "prompt": [{"role": "user", "content": "x"}],
        "rubrics": [{"criterion": "a", "points": 1}],
    }
    path = _write_jsonl(tmp_path / "dup.jsonl", [row, row])
    with pytest.raises(
        RubricError, match=r"dup\.jsonl:2: key 'prompt_id': duplicate id 'same' \(first at .*dup\.jsonl:1\)"
    ):
        load_rubric_prompts(path)
    assert len(load_rubric_prompts(path, skip_invalid=True).skipped) == 1
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_rubric_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="fmt must be one of"):
        load_rubric_prompts(path, fmt="csv")


# Inputs that used to escape skip_invalid (or carry no file:line). Each bad line sits between
# two good ones; it must raise a one-line RubricError naming data.jsonl:2, or be skipped and counted.
GOOD_LINE = json.dumps({"prompt": [{"role": "user", "content": "fine"}], "rubrics": [{"criterion": "ok", "points": 1}]})
RAW_BAD = {
    "huge integer points": (
        b'{"prompt": [{"role": "user", "content": "x"}], "rubrics": [{"criterion": "a", "points": 1' + b"0" * 400
        + b"}]}", r"'rubrics\[0\].points': points must be finite"),
    "non-UTF-8 bytes": (b'{"prompt": "caf\xe9", "rubrics": [{"criterion": "a", "points": 1}]}', "not UTF-8 text"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "lone surrogate": (b'{"prompt": "x\\ud800", "rubrics": [{"criterion": "a", "points": 1}]}',
                       "lone UTF-16 surrogate"),
    "unterminated string": (b'{"prompt": "abc', r"malformed JSON: Unterminated string starting at \(line 1, column"),
}


@pytest.mark.parametrize("case", sorted(RAW_BAD))
def test_raw_bad_lines_are_clear_skippable_errors(tmp_path, case):
    bad, pattern = RAW_BAD[case]
    path = tmp_path / "data.jsonl"
    path.write_bytes(GOOD_LINE.encode() + b"\n" + bad + b"\n" + GOOD_LINE.replace('"prompt"', '"prompt_id": "last", "prompt"').encode() + b"\n")
    with pytest.raises(RubricError, match=rf"data\.jsonl:2: .*{pattern}") as info:
        load_rubric_prompts(path)
    assert "\n" not in str(info.value) and "at at" not in str(info.value)
    prompts, skipped = load_rubric_prompts(path, skip_invalid=True)
    assert [p.prompt_id for p in prompts] == ["data-1", "last"]
    assert len(skipped) == 1 and skipped[0].where.endswith("data.jsonl:2")


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_unreadable_parquet_is_a_clear_skippable_error(tmp_path, damage):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "reward_model": {"rubrics": [{"criterion": "c", "points": 1.0}]},
             "extra_info": {"index": i}} for i in range(3)]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    data = path.read_bytes()
    path.write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    with pytest.raises(RubricError, match=r"train\.parquet:1: unreadable parquet"):
        load_rubric_prompts(path)
    prompts, skipped = load_rubric_prompts(path, skip_invalid=True)
    assert prompts == [] and len(skipped) == 1 and skipped[0].where.endswith("train.parquet:1")
