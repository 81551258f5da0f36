"""``costmodels.contracts.files``: a write that fails or is interrupted leaves no temporary file (or the next
write sweeps it), keeps the target's mode, and every OS error is one line naming the cause."""
from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

import costmodels.contracts.files as files
from costmodels.contracts.errors import AutoparError
from costmodels.contracts.files import check_output_path, sweep_stale_temporaries, write_text_atomic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def temporaries(folder) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.endswith(".tmp"))


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "p.json"
    target.write_text("old")

    def fail(src, dst):
        raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(AutoparError, match="cannot write"):
        write_text_atomic(target, "new")
    assert target.read_text() == "old" and temporaries(tmp_path) == []


@pytest.mark.parametrize("exc", [RuntimeError("bug"), KeyboardInterrupt()])
def test_an_exception_mid_write_leaves_no_temporary(tmp_path, monkeypatch, exc):
    def fail(fd):
        raise exc
    monkeypatch.setattr(files.os, "fsync", fail)
    with pytest.raises(type(exc)):
        write_text_atomic(tmp_path / "p.json", "new")
    assert temporaries(tmp_path) == [] and not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_write_leaves_no_temporary(tmp_path, monkeypatch, sig):
    """SIGINT (Python's KeyboardInterrupt) and SIGTERM (the CLI's handler) arrive while the data
    is being synced: the exception unwinds through the writer, which removes its file."""
    from autopar.cli.main import Interrupted, install_signal_handlers, restore_signal_handlers
    real_fsync = os.fsync

    def signalled(fd):
        real_fsync(fd)
        os.kill(os.getpid(), sig)
    saved = install_signal_handlers()
    try:
        monkeypatch.setattr(files.os, "fsync", signalled)
        with pytest.raises(Interrupted):
            write_text_atomic(tmp_path / "p.json", "new")
    finally:
        restore_signal_handlers(saved)
    assert temporaries(tmp_path) == []


def test_a_killed_writer_s_temporary_is_swept_by_the_next_write(tmp_path):
    """SIGKILL cannot be caught: the writer's file stays, named with its dead pid, and the next
    write to the same target removes it; a live writer's file is left alone."""
    code = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {ROOT!r})
        import costmodels.contracts.files as files
        files.os.fsync = lambda fd: (print("writing", flush=True), time.sleep(60))
        files.write_text_atomic({str(tmp_path / 'p.json')!r}, "x" * 1000)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    p.kill()
    p.wait(timeout=30)
    left = temporaries(tmp_path)
    assert len(left) == 1 and f".{p.pid}." in left[0]
    live = tmp_path / f".p.json.{os.getpid()}.abcd1234.tmp"          # this process: alive
    live.write_text("")
    write_text_atomic(tmp_path / "p.json", "new")
    assert temporaries(tmp_path) == [live.name]
    assert (tmp_path / "p.json").read_text() == "new"
    assert sweep_stale_temporaries(tmp_path / "p.json") == []


def test_an_old_nameless_temporary_is_swept_once_stale(tmp_path):
    old = tmp_path / ".p.json.k2j4l9x_.tmp"          # tempfile.mkstemp's name, older autopar
    old.write_text("")
    assert sweep_stale_temporaries(tmp_path / "p.json") == []      # fresh: maybe being written
    os.utime(old, (0, 0))
    assert sweep_stale_temporaries(tmp_path / "p.json") == [str(old)]


def test_the_target_keeps_its_mode_and_a_new_file_gets_the_umask_default(tmp_path):
    target = tmp_path / "shared.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    write_text_atomic(target, "new")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640 and target.read_text() == "new"
    old_umask = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "fresh.json", "x")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(tmp_path / "fresh.json").st_mode) == 0o640   # 0666 & ~027


@pytest.mark.parametrize("code,words", [
    (errno.ENOSPC, "the disk is full"), (errno.EACCES, "permission denied"),
    (errno.EROFS, "read-only file system"), (errno.EDQUOT, "quota"),
])
def test_os_errors_are_one_line_naming_the_cause(tmp_path, monkeypatch, code, words):
    real_open = os.open

    def fail(path, flags, mode=0o777, **kw):
        if str(path).endswith(".tmp"):
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, mode, **kw)
    monkeypatch.setattr(files.os, "open", fail)
    for call in (lambda: write_text_atomic(tmp_path / "p.json", "x"), lambda: check_output_path(tmp_path / "p.json")):
        with pytest.raises(AutoparError) as e:
            call()
        assert words in str(e.value) and "p.json" in str(e.value) and "\n" not in str(e.value)
    assert temporaries(tmp_path) == []


def test_a_full_disk_while_writing_is_one_line(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(AutoparError, match=r"cannot write '.*p.json': the disk is full"):
        write_text_atomic(tmp_path / "p.json", "x")
    assert temporaries(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused_before_writing(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        with pytest.raises(AutoparError, match="permission denied"):
            check_output_path(ro / "x.toml")
    finally:
        os.chmod(ro, 0o700)


@pytest.mark.parametrize("make,words", [
    (lambda d: "", "names no file"),
    (lambda d: str(d), "is a directory"),
    (lambda d: str(d / "missing" / "p.json"), "does not exist; create it first"),
    (lambda d: str(d / "afile" / "p.json"), "is not a folder"),
    (lambda d: "/dev/null", "not a regular file"),
])
def test_bad_output_paths_are_one_line(tmp_path, make, words):
    (tmp_path / "afile").write_text("")
    for call in (check_output_path, lambda p: write_text_atomic(p, "x")):
        with pytest.raises(AutoparError, match=words) as e:
            call(make(tmp_path))
        assert "\n" not in str(e.value)
    assert temporaries(tmp_path) == []


def test_a_missing_folder_is_made_only_when_asked(tmp_path):
    write_text_atomic(tmp_path / "new" / "p.json", "x", create_folder=True)
    assert (tmp_path / "new" / "p.json").read_text() == "x"
