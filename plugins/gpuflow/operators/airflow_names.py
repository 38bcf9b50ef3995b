"""Airflow names gpuflow uses that live elsewhere on Composer's 3.1.8 line (Airflow 3.1).

Airflow 3.3's Task SDK exports the task exceptions (``airflow.sdk.exceptions``) and the cron data-interval
timetable (``airflow.sdk``); Airflow 3.1.8's SDK exports neither, and its own are in ``airflow.exceptions`` and
``airflow.timetables.interval``. Found by running gpuflow's DAGs at 3.1.8 (``make test-composer LINE=3.1.8``):
nothing else differed. Each name is taken from the SDK where it has it.
"""

from __future__ import annotations

from typing import Any

try:
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowSensorTimeout,
        AirflowSkipException,
    )
except ImportError:  # Airflow 3.1 (typed as 3.3's, which mypy reads)
    from airflow.exceptions import (  # type: ignore[attr-defined, no-redef]
        AirflowException,
        AirflowFailException,
        AirflowSensorTimeout,
        AirflowSkipException,
    )

__all__ = ["AirflowException", "AirflowFailException", "AirflowSensorTimeout", "AirflowSkipException",
           "cron_data_interval_timetable"]


def cron_data_interval_timetable(cron: str, timezone: str = "UTC") -> Any:
    """Airflow's cron timetable whose runs cover the interval that has just ended (ds: its start)."""
    try:
        from airflow.sdk import CronDataIntervalTimetable
    except ImportError:  # Airflow 3.1
        from airflow.timetables.interval import CronDataIntervalTimetable  # type: ignore[assignment]
    return CronDataIntervalTimetable(cron, timezone=timezone)
