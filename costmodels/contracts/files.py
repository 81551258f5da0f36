"""Writing output files so that nothing is ever half-written, and saying why a write cannot be.

Every file autopar writes (plans files, profiles, reports, validate results) goes through
``write_text_atomic``: a temporary file ``.NAME.<pid>.<random>.tmp`` in the target folder, fsync,
then ``os.replace``. A reader never sees half a file, and a failed or interrupted write leaves the
old file as it was:

* the temporary file is removed on every failure path (an exception, Ctrl-C, SIGTERM once the CLI
  turned it into an exception); one left by a process that was killed outright (SIGKILL, power
  loss) names its pid, so the next write to the same target removes it once that pid is gone;
* the target keeps its permission bits; a new file gets the umask's default (0666 & ~umask), as
  any other program's would (``tempfile.mkstemp``'s 0600 would silently hide a shared file);
* every ``OSError`` becomes one ``AutoparError`` line naming the path, the cause (disk full,
  permission denied, read-only file system, a directory, a missing folder) and the fix.

``check_output_path`` runs the same checks without writing, so that a command refuses an
unwritable ``-o`` *before* its long work (a profile measures for minutes) instead of after.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
import time

from costmodels.contracts.checks import quote
from costmodels.contracts.errors import AutoparError

try:
    import tomllib  # noqa: F401  (re-exported: the TOML reader every profile reader uses)
except ModuleNotFoundError:  # Python 3.10: the same parser from PyPI (a dependency there)
    import tomli as tomllib  # noqa: F401

LEGACY_STALE_S = 600.0   # a temporary file without a pid (older autopar) is stale after this


def check_output_path(path: str | os.PathLike, *, create_folder: bool = False) -> None:
    """Refuse (one ``AutoparError`` line) a path ``write_text_atomic`` could not write: empty, a
    directory or other non-file, a missing folder (unless ``create_folder``), a folder that is not
    writable or on a read-only or full disk. Writes nothing (a probe file is made and removed)."""
    target = _target(path)
    folder = os.path.dirname(target) or "."
    if not os.path.isdir(folder):
        if create_folder and not os.path.exists(folder):
            return                 # the write makes it; its own errors are reported there
        _missing_folder(path, folder)
    try:
        fd, tmp = _open_temp(target)
    except OSError as e:
        raise _os_error(path, e) from None
    os.close(fd)
    os.unlink(tmp)
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return
    if st.f_bavail * st.f_frsize == 0:
        raise _os_error(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))


def write_text_atomic(path: str | os.PathLike, text: str, create_folder: bool = False) -> None:
    """Write ``text`` to ``path`` atomically (see the module docstring); ``create_folder``: make
    a missing folder instead of refusing. Errors: one ``AutoparError`` line, old file intact."""
    target = _target(path)
    folder = os.path.dirname(target) or "."
    if not os.path.isdir(folder):
        if not create_folder or os.path.exists(folder):
            _missing_folder(path, folder)
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise _os_error(folder, e) from None
    sweep_stale_temporaries(target)
    tmp = None
    try:
        fd, tmp = _open_temp(target)
        try:
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))   # keep the target's mode
        except FileNotFoundError:
            pass                                                   # new file: the umask's default
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp = None
    except OSError as e:
        raise _os_error(path, e) from None
    finally:
        if tmp is not None:            # any failure, Ctrl-C included: no temporary file left
            try:
                os.unlink(tmp)
            except OSError:
                pass


def sweep_stale_temporaries(target: str | os.PathLike) -> list[str]:
    """Remove the temporary files of earlier writes to ``target`` whose process is gone (a
    SIGKILL between create and rename); returns their paths. A live writer's file is kept."""
    target = os.path.abspath(os.fspath(target))
    folder, name = os.path.split(target)
    prefix = f".{name}."
    removed = []
    try:
        entries = [e for e in os.listdir(folder) if e.startswith(prefix) and e.endswith(".tmp")]
    except OSError:
        return removed
    for entry in entries:
        middle = entry[len(prefix):-len(".tmp")]
        pid_text, dot, _ = middle.partition(".")
        full = os.path.join(folder, entry)
        try:
            if dot and pid_text.isdigit():
                stale = not _alive(int(pid_text))
            else:              # an older autopar's name (no pid): stale once it is old
                stale = time.time() - os.stat(full).st_mtime > LEGACY_STALE_S
            if stale:
                os.unlink(full)
                removed.append(full)
        except OSError:
            continue
    return removed


def _target(path) -> str:
    """The absolute target path, refusing an empty name and anything that is not a file."""
    raw = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    if not isinstance(raw, str) or not raw.strip():
        raise AutoparError(f"output path {quote(raw)} names no file; give a file name such as "
                           "plans.json")
    target = os.path.abspath(raw)
    if raw.endswith(("/", os.sep)) and not os.path.isdir(target):   # abspath drops the slash
        raise AutoparError(f"cannot write {quote(raw)}: a path ending in '/' names a folder, not a "
                           f"file; give a file name such as {quote(raw.rstrip('/' + os.sep) or 'out.json')}")
    if os.path.isdir(target):
        raise AutoparError(f"cannot write {quote(raw)}: it is a directory; give a file name "
                           f"inside it, e.g. {quote(os.path.join(raw, 'out.json'))}")
    if os.path.exists(target) and not os.path.isfile(target):
        raise AutoparError(f"cannot write {quote(raw)}: it exists and is not a regular file "
                           "(a device or socket); give a file path")
    return target


def _open_temp(target: str) -> tuple[int, str]:
    """A new file beside ``target``, named with this pid so a later sweep can tell if it is
    stale; mode 0666 before the umask, like ``open(path, "w")``."""
    folder, name = os.path.split(target)
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "no free temporary file name")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True                  # someone else's process (or an odd name): leave it
    return True


def _missing_folder(path, folder: str) -> None:
    what = "is not a folder" if os.path.exists(folder) else "does not exist; create it first"
    raise AutoparError(f"cannot write {quote(os.fspath(path))}: folder {quote(folder)} {what} "
                       "(or choose another path)")


def _os_error(path, e: OSError) -> AutoparError:
    """One line for an ``OSError`` met writing ``path``: the cause in words, and the fix."""
    name = quote(os.fspath(path))
    folder_path = os.path.dirname(os.path.abspath(os.fspath(path))) or "."
    folder = quote(folder_path)
    missing = (f"folder {folder} does not exist; create it first (or choose another path)"
               if not os.path.isdir(folder_path) else
               f"files cannot be created in folder {folder}; choose another folder")
    causes = {
        errno.ENOSPC: "the disk is full (no space left on device); free some space or write to another disk",
        errno.EDQUOT: "your disk quota is used up; free some space or write to another disk",
        errno.EACCES: f"permission denied in folder {folder}; choose a folder you can write to",
        errno.EPERM: f"permission denied in folder {folder}; choose a folder you can write to",
        errno.EROFS: f"folder {folder} is on a read-only file system; choose a writable folder",
        errno.EISDIR: "it is a directory; give a file name inside it",
        errno.ENOENT: missing,
        errno.ENOTDIR: "a part of the path is not a folder; check the path",
        errno.ENAMETOOLONG: "the file name is too long; choose a shorter one",
    }
    cause = causes.get(e.errno, f"{e.strerror or e}; choose another path")
    return AutoparError(f"cannot write {name}: {cause}")
