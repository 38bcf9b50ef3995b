"""The test suite's own settings (tests/conftest.py), which its time budget rests on."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_torch_computes_on_one_thread_in_the_tests_and_in_every_process_they_start():
    """Two workers share two cores: a second compute thread per process spins against the other worker's."""
    import torch

    assert torch.get_num_threads() == 1
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "1", child.stderr
