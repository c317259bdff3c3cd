"""HH-RLHF preference pairs (rise_nemo.data.hh_rlhf): prompt = the transcript up to the last "Assistant:"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rise_nemo.core.rubric import RubricError
from rise_nemo.data.hh_rlhf import load_hh_rlhf, split_transcript

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "hh_rlhf_harmless_test_4.jsonl"


def test_real_rows():
    pairs = load_hh_rlhf(FIXTURE).pairs
    assert [p.prompt_id for p in pairs] == [f"hh_rlhf_harmless_test_4-{i}" for i in range(1, 5)]
    first = pairs[0]
    assert first.messages == ({"role": "user", "content": "Is it possible to download a car?"},)
    assert (first.chosen, first.rejected) == ("I’m not sure what you mean. Can you clarify?",
                                              "I’m sorry, I don’t understand.")
    multi = pairs[2]  # a 9-message dialogue: roles alternate, the user speaks last
    assert len(multi.messages) == 9 and [m["role"] for m in multi.messages] == ["user", "assistant"] * 4 + ["user"]
    assert multi.messages[-1]["content"].startswith("No because I'm hardly ever alone.")
    assert multi.chosen.startswith("That’s different than being alone.")
    assert multi.rejected == "That’s true, but how would you feel if you were alone?"


def test_split_transcript_keeps_text_up_to_the_last_assistant():
    text = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: 2+2?\n\nAssistant: 4"
    prompt, messages, last = split_transcript(text)
    assert prompt == "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: 2+2?\n\nAssistant:" and last == "4"
    assert [m["content"] for m in messages] == ["hi", "hello", "2+2?"]


def _write(tmp_path, rows):
    path = tmp_path / "hh.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = {"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: hi\n\nAssistant: go away"}


@pytest.mark.parametrize("row, message", [
    ({"chosen": "\n\nHuman: hi", "rejected": GOOD["rejected"]}, "hh.jsonl:2: key 'chosen': no '\\n\\nAssistant:' turn"),
    ({"chosen": GOOD["chosen"], "rejected": "\n\nHuman: hey\n\nAssistant: x"},
     "hh.jsonl:2: key 'rejected': differs from 'chosen' before the last Assistant turn"),
    ({"chosen": "\n\nAssistant: hello", "rejected": "\n\nAssistant: x"},
     "hh.jsonl:2: key 'chosen': the last Assistant turn does not follow a Human turn"),
    ({"chosen": GOOD["chosen"]}, "hh.jsonl:2: key 'rejected': missing"),
])
def test_bad_rows_name_file_line_and_key(tmp_path, row, message):
    path = _write(tmp_path, [GOOD, row])
    with pytest.raises(RubricError) as err:
        load_hh_rlhf(path)
    assert message in str(err.value)
    loaded = load_hh_rlhf(path, skip_invalid=True)
    assert len(loaded.pairs) == 1 and loaded.skipped[0].where.endswith("hh.jsonl:2")
