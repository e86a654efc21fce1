"""held_alone: one holder at a time, for a directory or a lock file; a lock file is there
only while held, and one a killed holder left is taken by the next."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.errors import HarnessError
from harness.locks import held_alone


def test_a_lock_file_is_held_by_one_and_gone_after(tmp_path) -> None:
    path = str(tmp_path / ".run.lock")
    with held_alone(path, "busy"):
        assert os.path.exists(path)
        with pytest.raises(HarnessError, match="^busy$"):
            with held_alone(path, "busy"):
                pass
        assert os.path.exists(path)  # the refused one did not remove the holder's file
    assert not os.path.exists(path)
    with held_alone(path, "busy"):  # free again
        pass


def test_a_lock_file_a_killed_holder_left_is_taken_and_removed(tmp_path) -> None:
    path = tmp_path / ".run.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from harness.locks import held_alone\n"
        f"with held_alone({str(path)!r}, 'busy'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(HarnessError, match="^busy$"):
            with held_alone(str(path), "busy"):
                pass
    finally:
        holder.kill()
        holder.wait(30)
    assert path.exists()  # SIGKILL: no clean-up ran, but the kernel let go of the lock
    with held_alone(str(path), "busy"):
        pass
    assert not path.exists()


def test_a_directory_is_held_and_stays(tmp_path) -> None:
    with held_alone(str(tmp_path), "in use"):
        with pytest.raises(HarnessError, match="^in use$"):
            with held_alone(str(tmp_path), "in use"):
                pass
    assert tmp_path.is_dir()
    with held_alone(str(tmp_path), "in use"):
        pass


def test_a_directory_held_shared_admits_sharers_and_keeps_out_a_holder_alone(tmp_path) -> None:
    with held_alone(str(tmp_path), "in use", shared=True):
        with held_alone(str(tmp_path), "in use", shared=True):  # another sharer
            pass
        with pytest.raises(HarnessError, match="^in use$"):
            with held_alone(str(tmp_path), "in use"):
                pass
    with held_alone(str(tmp_path), "in use"):
        with pytest.raises(HarnessError, match="^in use$"):
            with held_alone(str(tmp_path), "in use", shared=True):
                pass
    with pytest.raises(ValueError, match="for a directory"):  # a lock file goes when any sharer lets go
        with held_alone(str(tmp_path / ".lock"), "in use", shared=True):
            pass
