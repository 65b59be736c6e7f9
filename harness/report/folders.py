"""Report folders on disk: a folder appears whole or not at all, and never over another.

* `preflight(out, reports_root)`: before any work, a one-line error if the report
  could not be written later (the target taken, even by a dangling link; a parent
  that is a file; a place where no folder can be made).
* `write_folder(target, files)`: the files are written into a hidden temporary
  sibling, which is renamed onto `target` only after `target` was claimed with
  `os.mkdir` (atomic: two writers never get the same name, and nobody's folder is
  ever replaced).  With `unique` (for a name `default_folder` chose) it moves on to
  the next free suffix when another process took it meanwhile; an explicit `--out`
  that was taken is an `OutputExistsError`.  A write that fails (a full disk, permissions) removes
  everything it made and raises `OutputWriteError`, after keeping the JSON
  documents under the system temp folder and naming the place.
* `replace_folder(folder, files)`: `harness report` in place: the complete new
  folder is built beside the old one and swapped in; on any failure the old folder
  stays as it was.

New folders get the permissions `mkdir` gives (0o777 less the umask), and an
interrupt at any point leaves no temporary folder behind.
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .. import locations
from ..errors import OutputExistsError, OutputWriteError


def _numbered(base: Path, i: int) -> Path:
    return base if i == 1 else base.with_name(f"{base.name}-{i}")


def default_folder(name: str, reports_root: Path) -> Path:
    """`reports_root/<name>-<UTC time>` (with `-2`, `-3`, ... if taken); `write_folder`
    takes the next free suffix (with `unique=True`) if another process claims this one first."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = reports_root / f"{name}-{stamp}"
    i = 1
    while os.path.lexists(_numbered(base, i)):
        i += 1
    return _numbered(base, i)


def check_new(target: Path) -> Path:
    """`target`, which must not exist yet, not even as a dangling symbolic link
    (OutputExistsError otherwise)."""
    if os.path.lexists(target):
        what = "is a symbolic link" if os.path.islink(target) else "already exists"
        raise OutputExistsError(f"{target} {what}; harness never overwrites a report (choose another --out)")
    return target


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _probe(folder: Path, what: str) -> None:
    """UserError unless a folder can be created in `folder` (or, when it does not exist
    yet, in its nearest existing ancestor, which must be a folder)."""
    place = folder
    while not os.path.lexists(place) and place != place.parent:
        place = place.parent
    if not place.is_dir():
        raise OutputWriteError(f"{folder}: cannot write the {what} there: {place} is not a folder")
    probe = place / f".harness-probe-{secrets.token_hex(4)}"
    try:
        try:
            os.mkdir(probe)
        except OSError as exc:
            raise OutputWriteError(f"{folder}: cannot write the {what} there: {place}: {_why(exc)}") from None
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass


def preflight(out: Path | None = None, reports_root: Path | None = None) -> None:
    """Raise a UserError now, before any work, if a report folder could not be written
    at `out` (which must not exist) or, without `out`, under `reports_root` (default
    `reports`, which must be a folder if it exists).  Creates nothing."""
    if out is not None:
        check_new(Path(out))
        _probe(Path(out).parent, "report folder")
        return
    root = Path(reports_root) if reports_root is not None else Path("reports")
    if os.path.lexists(root) and not root.is_dir():
        raise OutputWriteError(f"{root}: cannot write reports there: it is not a folder")
    _probe(root, "reports")


def preflight_file(path: Path, what: str) -> None:
    """Raise a UserError now, before any work, unless a file can be written at `path`: its folder
    accepts a new file, and `path` is absent or a regular file (replaced)."""
    if os.path.lexists(path):
        problem = locations.file_problem(path)
        if problem is not None:
            raise OutputWriteError(f"{path}: cannot write the {what} there: it is {problem}")
    _probe(Path(path).parent, what)


def _temp_sibling(target: Path, tag: str) -> Path:
    """A name for a hidden temporary sibling of `target` (not created)."""
    return target.parent / f".{target.name[:80]}.{secrets.token_hex(6)}.{tag}"


def _fill(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _remove(path: Path) -> None:
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)


def _move_into(tmp: Path, candidate: Path) -> bool:
    """Rename `tmp` to `candidate` if `candidate` is free (False if it is taken)."""
    try:
        try:
            os.mkdir(candidate)  # the claim: fails if anything (folder, file, link) is there
        except FileExistsError:
            return False
        if os.name == "nt":  # no rename onto a folder there: give the claim up just before
            os.rmdir(candidate)
        os.rename(tmp, candidate)  # onto our own empty folder: atomic on POSIX
    except BaseException:
        try:
            os.rmdir(candidate)  # an empty claim only, never a folder with anyone's files
        except OSError:
            pass
        raise
    return True


def rescue(files: dict[str, bytes]) -> Path | None:
    """Keep the JSON documents of `files` in a new folder under the system temp folder
    (None if there are none or that fails too)."""
    docs = {rel: data for rel, data in files.items() if rel.endswith(".json")}
    if not docs:
        return None
    try:
        folder = Path(tempfile.mkdtemp(prefix="harness-rescued-"))
        _fill(folder, docs)
    except OSError:
        return None
    return folder


def _failed(target: Path, exc: OSError, files: dict[str, bytes], keep: bool) -> OutputWriteError:
    kept = rescue(files) if keep else None
    where = f"; its {', '.join(sorted({Path(r).name for r in files if r.endswith('.json')}))} kept in {kept}" \
        if kept else ""
    return OutputWriteError(f"{target}: could not write the report: {_why(exc)}{where}")


def write_folder(target: Path, files: dict[str, bytes], unique: bool = False, keep: bool = True) -> Path:
    """Write `files` ({relative path: bytes}) as the new folder `target`, all at once;
    return the folder written.  `unique` (for a name `default_folder` chose) moves on to
    `target-2`, `-3`, ... while the name is taken; otherwise a
    taken `target` is an OutputExistsError.  On an OSError nothing is left behind and
    the OutputWriteError says where the JSON documents were kept (with `keep`)."""
    tmp = _temp_sibling(target, "tmp")
    try:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(tmp)  # 0o777 less the umask, like any new folder
            _fill(tmp, files)
            i = 1
            while not _move_into(tmp, final := _numbered(target, i) if unique else target):
                if not unique:  # taken since it was checked
                    check_new(target)
                    raise OutputExistsError(f"{target} already exists; harness never overwrites a report")
                i += 1
        except OutputExistsError as exc:
            kept = rescue(files) if keep else None
            raise OutputExistsError(f"{exc}" + (f"; the evidence is kept in {kept}" if kept else "")) from None
        except OSError as exc:
            raise _failed(target, exc, files, keep) from None
    finally:
        _remove(tmp)
    return final


def replace_folder(folder: Path, files: dict[str, bytes], carry: Iterable[str] = ()) -> None:
    """Make `folder` hold exactly `files` plus its own entries named in `carry`, at once:
    the new folder is built complete in a temporary sibling (carried entries
    hard-linked, or copied), the old one renamed aside, the new one renamed into place
    and the old one removed.  On any failure (OutputWriteError for an OSError) the old
    folder is as it was and no temporary folder is left."""
    new, old = _temp_sibling(folder, "new"), _temp_sibling(folder, "old")
    try:
        try:
            os.mkdir(new)
            for name in carry:
                src = folder / name
                if src.is_dir() and not src.is_symlink():
                    shutil.copytree(src, new / name, symlinks=True, copy_function=_link_or_copy)
                elif os.path.lexists(src):
                    _link_or_copy(str(src), str(new / name))
            _fill(new, files)
            os.chmod(new, os.stat(folder).st_mode & 0o7777)
            os.rename(folder, old)
            os.rename(new, folder)
        except OSError as exc:
            raise OutputWriteError(f"{folder}: could not re-render the report: {_why(exc)}; "
                                   "the folder is unchanged") from None
    except BaseException:
        if not os.path.lexists(folder) and os.path.lexists(old):
            os.rename(old, folder)  # put the old folder back
        raise
    finally:
        _remove(new)
        if os.path.lexists(folder):
            _remove(old)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)
