"""The demo's report explains a local answer that waited for the DirectRunner's Pub/Sub pull."""

from gpuflow.tools.demo_report import straggler_note


def answers(*latencies: float) -> list[dict]:
    return [{"prompt": f"p{i}", "answer": "a", "latency_s": latency} for i, latency in enumerate(latencies)]


def test_a_straggler_near_the_pull_timeout_is_explained():
    note = straggler_note(answers(2.8, 3.3, 32.3))
    assert note is not None and note.startswith("1 answer(s) took 32s or more") and "DirectRunner" in note


def test_prompt_answers_need_no_note():
    assert straggler_note(answers(2.8, 3.3, 9.0)) is None


def test_the_report_names_the_slowest_answer():
    from gpuflow.tools.demo_report import slowest_answer

    rows = [{**row, "id": f"id-{i}"} for i, row in enumerate(answers(2.8, 4.25, 3.3))]
    assert slowest_answer(rows) == "slowest answer: 4.2s (prompt id-1)"
