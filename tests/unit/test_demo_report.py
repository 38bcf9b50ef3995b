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


def test_the_task_table_lists_each_tasks_state_and_time_in_order():
    from gpuflow.tools.demo_report import format_task_table

    table = format_task_table([("preflight", "success", 2.04), ("launch", "success", 61.5), ("cleanup", "skipped",
                                                                                             None)])
    lines = table.splitlines()
    assert lines[0].split() == ["task", "state", "seconds"]
    assert lines[1].split() == ["preflight", "success", "2.0"] and lines[2].split() == ["launch", "success", "61.5"]
    assert lines[3].split() == ["cleanup", "skipped"]
