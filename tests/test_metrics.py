"""metrics.h5 is readable while a run writes it, and holds exactly the rows appended."""
import subprocess
import threading
import sys

import numpy as np
import pytest

from hpcrl.io.metrics import MetricsWriter, read_metrics, rebuild_metrics


def test_rows_read_back_while_the_writer_is_open(tmp_path):
    path = str(tmp_path / "metrics.h5")
    writer = MetricsWriter(path, attrs={"config": "run: {}"})
    writer.append({"frames": 10, "return_mean": 1.5, "digest": np.array([3, 4], dtype=np.int64)})
    writer.append({"frames": 20, "return_mean": np.nan, "digest": np.array([5, 6], dtype=np.int64)})
    # another process, as a user watching a run would
    code = f"from hpcrl.io.metrics import read_metrics; print(read_metrics({path!r})['frames'].tolist())"
    seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.strip() == "[10, 20]"
    writer.append({"frames": 30, "return_mean": 2.0, "digest": np.array([7, 8], dtype=np.int64)})
    writer.close()
    m = read_metrics(path)
    assert list(m["frames"]) == [10, 20, 30] and m["frames"].dtype == np.int64
    assert m["return_mean"][0] == 1.5 and np.isnan(m["return_mean"][1])
    assert m["digest"].tolist() == [[3, 4], [5, 6], [7, 8]]


def test_buffered_rows_reach_the_file_as_one_block_on_flush_and_close(tmp_path):
    """A learner's rows are held for up to a flush interval and written together: readers see none
    of them before the flush, all of them in order after, and close writes the rest."""
    path = str(tmp_path / "metrics.h5")
    writer = MetricsWriter(path, tensorboard_dir=str(tmp_path), flush_interval_s=3600)
    for v in (1, 2, 3):
        writer.append({"frames": 10 * v, "policy_version": v, "digest": np.array([v, -v], dtype=np.int64)})
    assert writer.rows == 0 and read_metrics(path) == {}
    with pytest.raises(ValueError, match="keys changed"):  # refused when appended, not at the flush
        writer.append({"frames": 40})
    writer.flush()
    assert writer.rows == 3 and read_metrics(path)["policy_version"].tolist() == [1, 2, 3]
    writer.append({"frames": 40, "policy_version": 4, "digest": np.array([4, -4], dtype=np.int64)})
    assert read_metrics(path)["frames"].tolist() == [10, 20, 30]
    writer.close()
    m = read_metrics(path)
    assert m["frames"].tolist() == [10, 20, 30, 40] and m["digest"][:, 1].tolist() == [-1, -2, -3, -4]


def test_a_row_with_other_keys_is_refused(tmp_path):
    writer = MetricsWriter(str(tmp_path / "m.h5"))
    writer.append({"frames": 1})
    with pytest.raises(ValueError, match="keys changed"):
        writer.append({"frames": 2, "extra": 1.0})
    writer.close()


def test_resume_cuts_rows_after_the_checkpoint_and_continues(tmp_path):
    path = str(tmp_path / "metrics.h5")
    writer = MetricsWriter(path)
    for v in (1, 2, 3, 4):  # the run wrote rows for versions 3 and 4 after its checkpoint at 2
        writer.append({"frames": 10 * v, "policy_version": v})
    writer.close()
    assert rebuild_metrics(path, through_version=2).rows == 2
    resumed = MetricsWriter(path, resume=True)
    resumed.append({"frames": 30, "policy_version": 3})
    resumed.close()
    m = read_metrics(path)
    assert m["policy_version"].tolist() == [1, 2, 3] and m["frames"].tolist() == [10, 20, 30]


HOLD_OPEN = """
import sys, h5py
from hpcrl.io.h5safe import open_for_reading
f = open_for_reading(sys.argv[1], swmr=True) if sys.argv[2] == "hpcrl" else h5py.File(sys.argv[1], "r")
print("open", flush=True)
sys.stdin.readline()
"""


def _write_rows(writer: MetricsWriter, *frames: int) -> None:
    for f in frames:
        writer.append({"frames": f})
    writer.close()


def _hold_open(path: str, how: str) -> subprocess.Popen:
    """Another process with `path` open for reading until its stdin closes: hpcrl's own reader
    ("hpcrl"), or a plain h5py one, which takes HDF5's lock, as a user's session would."""
    reader = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, path, how], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "open"
    return reader


def test_a_run_resumes_its_metrics_while_another_process_reads_them(tmp_path):
    """A test or a user polling metrics.h5 while a run relaunches once made the resumed learner die
    at start-up: HDF5 refused its writer while the reader held the file's lock."""
    path = str(tmp_path / "metrics.h5")
    _write_rows(MetricsWriter(path), 1)
    reader = _hold_open(path, "hpcrl")
    try:
        _write_rows(MetricsWriter(path, resume=True), 2)
    finally:
        reader.communicate("")
    assert read_metrics(path)["frames"].tolist() == [1, 2]


def test_a_writer_waits_for_a_locking_reader_and_names_it_if_it_stays(tmp_path):
    from hpcrl.io.h5safe import open_for_writing
    path = str(tmp_path / "metrics.h5")
    _write_rows(MetricsWriter(path), 1)
    reader = _hold_open(path, "h5py")
    try:
        with pytest.raises(OSError, match="another process holds HDF5's lock.*close that reader"):
            open_for_writing(path, "a", wait_s=0.2)
        closer = threading.Timer(0.5, reader.stdin.close)  # the reader lets go while the writer waits
        closer.start()
        _write_rows(MetricsWriter(path, resume=True), 2)
        closer.join()
    finally:
        reader.kill()
        reader.wait()
    assert read_metrics(path)["frames"].tolist() == [1, 2]
